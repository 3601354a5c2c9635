//! A hosted account's key and base URL, and the checks of its `options`, shared by every
//! adapter's account settings.
//!
//! Contract:
//! - The API key is named, never written in the config: `api_key_env` (read once, at
//!   start), `api_key_file` (trailing newline ignored), or `credential = "env:VAR"` /
//!   `"file:PATH"`. A named key that is missing or empty is a start error naming the
//!   account and the reference, never the value; an account naming none gets no adapter
//!   (its attempts advance as `unbound_account`).
//! - Every URL an adapter calls derives from the account's `base_url` and `options`, so a
//!   self-hosted deployment and a test fake are configured the same way; a `base_url` is an
//!   origin with an optional path ([`check_base_url`]).
//! - Option errors are `(field, message)` with the field as `options.<name>`, which the
//!   registry turns into an [`AccountError`] naming the account.

use std::collections::BTreeMap;

use sandgate_router::AccountConfig;

use crate::credentials::Secret;

/// An option error: the config key at fault and what is wrong.
pub type OptionError = (String, String);

/// Refuses an option the adapter does not know, naming the ones it does.
pub fn known_options(
    kind: &str,
    options: &BTreeMap<String, String>,
    known: &[&str],
) -> Result<(), OptionError> {
    match options.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err((
            format!("options.{key}"),
            format!("unknown option for {kind} account ({})", known.join(", ")),
        )),
    }
}

/// A positive number of seconds (or other unit, named in the message), when set.
pub fn positive(
    options: &BTreeMap<String, String>,
    name: &str,
    unit: &str,
) -> Result<Option<u64>, OptionError> {
    match options.get(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|v| *v > 0)
            .map(Some)
            .ok_or((
                format!("options.{name}"),
                format!("must be a positive number of {unit}"),
            )),
    }
}

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
    pub(super) fn new(
        account: &AccountConfig,
        field: &str,
        message: impl Into<String>,
    ) -> AccountError {
        AccountError {
            account: account.name.clone(),
            field: field.to_string(),
            message: message.into(),
        }
    }
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
pub fn check_base_url(text: &str) -> Result<(), String> {
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
