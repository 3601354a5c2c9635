//! Who is calling: the principals that front ends authenticate, by secret.
//!
//! Every front end (the `/v1` API's `[[api.tokens]]`, the E2B facade's `[[e2b.api_keys]]`)
//! turns a presented secret into a [`Principal`] the same way, so the pieces live here,
//! below both: [`ApiAuth`] (secrets compared in constant time), the embedded default's
//! local admin and its generated secret files, and the stored form of delegated tokens
//! ([`token_hash`]). It imports only `base` and `config`; nothing here knows HTTP routes,
//! the store or policy.

use std::sync::Arc;

use http::HeaderValue;
use subtle::ConstantTimeEq;

pub use crate::base::{DelegationScope, Principal};
use crate::config::ApiTokenConfig;

/// Prefix of delegated capability tokens.
pub const DELEGATION_TOKEN_PREFIX: &str = "sgd_";

#[derive(Debug, thiserror::Error)]
#[error("config key `api.tokens[{index}].token_env`: environment variable {var} is not set")]
pub struct AuthConfigError {
    index: usize,
    var: String,
}

/// Principals by secret.
#[derive(Default)]
pub struct ApiAuth {
    tokens: Vec<(Vec<u8>, Arc<Principal>)>,
}

impl std::fmt::Debug for ApiAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiAuth")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl ApiAuth {
    /// The principals of `[[api.tokens]]`; a `token_env` naming an unset variable is an
    /// error (a missing secret must not silently drop a principal).
    pub fn from_config(tokens: &[ApiTokenConfig]) -> Result<ApiAuth, AuthConfigError> {
        let mut out = Vec::new();
        for (index, t) in tokens.iter().enumerate() {
            let token = match (&t.token, &t.token_env) {
                (Some(token), _) => token.clone(),
                (None, Some(var)) => std::env::var(var).map_err(|_| AuthConfigError {
                    index,
                    var: var.clone(),
                })?,
                (None, None) => continue,
            };
            out.push((
                token.into_bytes(),
                Arc::new(Principal {
                    principal: t.principal.clone(),
                    workspace: t.workspace.clone(),
                    roles: t.roles.clone(),
                    delegation: None,
                }),
            ));
        }
        Ok(ApiAuth { tokens: out })
    }

    /// Principals by secret (the E2B facade's API keys).
    pub fn from_secrets(entries: Vec<(String, Principal)>) -> ApiAuth {
        ApiAuth {
            tokens: entries
                .into_iter()
                .map(|(secret, p)| (secret.into_bytes(), Arc::new(p)))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Compares against every token in constant time, so timing reveals nothing.
    pub fn authenticate(&self, header: Option<&HeaderValue>) -> Option<Arc<Principal>> {
        self.authenticate_secret(bearer(header)?.as_bytes())
    }

    /// The principal `token` stands for, compared in constant time against every one.
    pub fn authenticate_secret(&self, token: &[u8]) -> Option<Arc<Principal>> {
        let mut found = None;
        for (candidate, principal) in &self.tokens {
            if bool::from(candidate.as_slice().ct_eq(token)) {
                found = Some(principal.clone());
            }
        }
        found
    }

    /// The embedded default's credential: an admin token for workspace `default`, read from
    /// `file` or generated into it (mode 0600) on first start.
    pub fn local_admin(file: &std::path::Path) -> std::io::Result<ApiAuth> {
        let token = local_secret(file, "sgt_", 24)?;
        Ok(ApiAuth {
            tokens: vec![(token.into_bytes(), Arc::new(local_admin_principal()))],
        })
    }

    /// The principal as configured now (a delegation's authority is re-read at each use).
    pub fn principal_named(&self, principal: &str, workspace: &str) -> Option<Arc<Principal>> {
        self.tokens
            .iter()
            .map(|(_, p)| p)
            .find(|p| p.principal == principal && p.workspace == workspace)
            .cloned()
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
pub fn bearer(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// The embedded default's admin: principal `local-admin` in workspace `default`.
pub fn local_admin_principal() -> Principal {
    Principal {
        principal: "local-admin".into(),
        workspace: "default".into(),
        roles: vec!["admin".into()],
        delegation: None,
    }
}

/// A secret kept in `file`: read, or generated into it (`prefix` and `bytes` random bytes
/// in hex, mode 0600) on first start.
pub fn local_secret(file: &std::path::Path, prefix: &str, bytes: usize) -> std::io::Result<String> {
    if !file.exists() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(file)?;
        out.write_all(format!("{prefix}{}\n", crate::base::ids::random_hex(bytes)).as_bytes())?;
        out.sync_all()?;
    }
    let token = std::fs::read_to_string(file)?.trim().to_string();
    if token.len() < 16 {
        return Err(std::io::Error::other(format!(
            "{} holds no usable secret; delete it to get a new one",
            file.display()
        )));
    }
    Ok(token)
}

/// The stored form of a delegated token (its SHA-256 in hex): only this is kept, so the
/// store never holds a usable token.
pub fn token_hash(token: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}
