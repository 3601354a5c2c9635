//! Building hosted-provider adapters from `[[accounts]]`.
//!
//! Contract:
//! - One adapter per account, shared by every pool on it (they share its HTTP connections
//!   and its rate limits).
//! - The API key is named, never written in the config: `api_key_env` (read once, at
//!   start), `api_key_file` (trailing newline ignored), or `credential = "env:VAR"` /
//!   `"file:PATH"`. A named key that is missing or empty is a start error naming the
//!   account and the reference, never the value; an account naming none gets no adapter
//!   (its attempts advance as `unbound_account`).
//! - Every URL an adapter calls derives from the account's `base_url` and `options`, so a
//!   self-hosted deployment and a test fake are configured the same way.
//! - Kinds without an adapter build nothing: their pools advance as `unsupported`.

use std::sync::Arc;

use sandgate_router::{AccountConfig, ProviderKind};

use super::daytona::{Daytona, DaytonaAccount};
use super::e2b::{E2b, E2bAccount};
use super::runloop::{Runloop, RunloopAccount};
use super::vercel::{Vercel, VercelAccount};
use super::Provider;
use crate::credentials::Secret;

/// Why an account's adapter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("account {account}: {field}: {message}")]
pub struct AccountError {
    pub account: String,
    /// The config key at fault, e.g. `api_key_env`, `options.timeout_secs`.
    pub field: String,
    pub message: String,
}

impl AccountError {
    fn new(account: &AccountConfig, field: &str, message: impl Into<String>) -> AccountError {
        AccountError {
            account: account.name.clone(),
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// Whether this build has an adapter for `kind` on hosted accounts.
pub fn has_adapter(kind: ProviderKind) -> bool {
    matches!(
        kind,
        ProviderKind::E2b | ProviderKind::Daytona | ProviderKind::Vercel | ProviderKind::Runloop
    )
}

/// Whether this build's adapter for `kind` locks a sandbox's egress to the gateway.
pub fn locks_to_gateway(kind: ProviderKind) -> bool {
    has_adapter(kind)
}

/// The adapter for one account, or `None` when this build has none for its kind.
pub fn build(
    kind: ProviderKind,
    account: &AccountConfig,
    tls: &rustls::ClientConfig,
) -> Result<Option<Arc<dyn Provider>>, AccountError> {
    // An account naming no key cannot serve; its pools' attempts advance as
    // `unbound_account` (the coordinator checks), which is not a reason to refuse to start.
    if !has_adapter(kind) || !account.has_credential() {
        return Ok(None);
    }
    let key = api_key(account)?;
    let base_url = account.base_url.as_deref();
    if let Some(url) = base_url {
        check_base_url(url).map_err(|m| AccountError::new(account, "base_url", m))?;
    }
    let adapter: Arc<dyn Provider> = match kind {
        ProviderKind::E2b => {
            let settings = E2bAccount::from_options(base_url, &account.options, key)
                .map_err(|(field, m)| AccountError::new(account, &field, m))?;
            Arc::new(
                E2b::new(settings, tls.clone())
                    .map_err(|m| AccountError::new(account, "base_url", m))?,
            )
        }
        ProviderKind::Daytona => {
            let settings = DaytonaAccount::from_options(base_url, &account.options, key)
                .map_err(|(field, m)| AccountError::new(account, &field, m))?;
            Arc::new(
                Daytona::new(settings, tls.clone())
                    .map_err(|m| AccountError::new(account, "base_url", m))?,
            )
        }
        ProviderKind::Vercel => {
            let settings = VercelAccount::from_options(base_url, &account.options, key)
                .map_err(|(field, m)| AccountError::new(account, &field, m))?;
            Arc::new(
                Vercel::new(settings, tls.clone())
                    .map_err(|m| AccountError::new(account, "base_url", m))?,
            )
        }
        ProviderKind::Runloop => {
            let settings = RunloopAccount::from_options(base_url, &account.options, key)
                .map_err(|(field, m)| AccountError::new(account, &field, m))?;
            Arc::new(
                Runloop::new(settings, tls.clone())
                    .map_err(|m| AccountError::new(account, "base_url", m))?,
            )
        }
        _ => return Ok(None),
    };
    Ok(Some(adapter))
}

/// The account's API key, from the reference it names.
pub fn api_key(account: &AccountConfig) -> Result<Secret, AccountError> {
    let (field, reference) = match (
        &account.api_key_env,
        &account.api_key_file,
        &account.credential,
    ) {
        (Some(var), None, None) => ("api_key_env", format!("env:{var}")),
        (None, Some(path), None) => ("api_key_file", format!("file:{path}")),
        (None, None, Some(reference)) => ("credential", reference.clone()),
        (None, None, None) => {
            return Err(AccountError::new(
                account,
                "api_key_env",
                "a hosted account needs its API key: set api_key_env or api_key_file",
            ))
        }
        _ => {
            return Err(AccountError::new(
                account,
                "api_key_env",
                "name the API key once: api_key_env, api_key_file or credential",
            ))
        }
    };
    let text = resolve(&reference).map_err(|m| AccountError::new(account, field, m))?;
    let text = text.trim_end_matches(['\r', '\n']);
    if text.is_empty() {
        return Err(AccountError::new(
            account,
            field,
            format!("{reference} is empty"),
        ));
    }
    if text.chars().any(|c| c.is_control()) {
        return Err(AccountError::new(
            account,
            field,
            format!("{reference} holds control characters (an API key is one line of text)"),
        ));
    }
    Ok(Secret::new(text.to_string()))
}

fn resolve(reference: &str) -> Result<String, String> {
    if let Some(var) = reference.strip_prefix("env:") {
        return std::env::var(var)
            .map_err(|_| format!("the environment variable {var} is not set"));
    }
    if let Some(path) = reference.strip_prefix("file:") {
        return std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"));
    }
    // Not echoed: a reference without a scheme may be a key written inline.
    Err("a hosted account's credential is env:VAR or file:PATH (the value is not shown)".into())
}

/// An `http(s)://` origin with an optional path prefix, no credentials, query or fragment.
fn check_base_url(text: &str) -> Result<(), String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("{text:?}: the scheme must be https (or http)"));
    }
    match uri.authority() {
        None => return Err(format!("{text:?} has no host")),
        Some(a) if a.as_str().contains('@') => {
            return Err(format!(
                "{text:?} carries credentials; name the API key with api_key_env"
            ))
        }
        Some(_) => {}
    }
    if uri.query().is_some() {
        return Err(format!("{text:?}: a base URL has no query"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> AccountConfig {
        AccountConfig::new("e2b-a", "e2b")
    }

    #[test]
    fn the_key_comes_from_the_reference_and_never_appears_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "e2b_sekrit\n").unwrap();
        let a = AccountConfig {
            api_key_file: Some(path.display().to_string()),
            ..account()
        };
        assert_eq!(api_key(&a).unwrap().expose(), "e2b_sekrit");

        let missing = AccountConfig {
            api_key_env: Some("SANDGATE_TEST_SURELY_UNSET_VAR".into()),
            ..account()
        };
        let e = api_key(&missing).unwrap_err();
        assert_eq!(e.field, "api_key_env");
        assert!(
            e.to_string().contains("SANDGATE_TEST_SURELY_UNSET_VAR"),
            "{e}"
        );

        std::fs::write(&path, "two\nlines\n").unwrap();
        let e = api_key(&a).unwrap_err();
        assert!(!e.to_string().contains("two"), "{e}");

        let none = account();
        assert_eq!(api_key(&none).unwrap_err().field, "api_key_env");
        let both = AccountConfig {
            api_key_env: Some("A".into()),
            api_key_file: Some("/x".into()),
            ..account()
        };
        assert!(api_key(&both).unwrap_err().message.contains("once"));
        let inline = AccountConfig {
            credential: Some("e2b_abc123".into()),
            ..account()
        };
        let e = api_key(&inline).unwrap_err();
        assert_eq!(e.field, "credential");
        assert!(!e.to_string().contains("abc123"), "{e}");
    }

    #[test]
    fn base_urls_are_origins() {
        assert!(check_base_url("https://api.e2b.app").is_ok());
        assert!(check_base_url("http://127.0.0.1:8080/api").is_ok());
        for bad in [
            "api.e2b.app",
            "ftp://x",
            "https://user:pw@api.e2b.app",
            "https://api.e2b.app/?k=v",
        ] {
            assert!(check_base_url(bad).is_err(), "{bad}");
        }
    }
}
