//! API callers: `Authorization: Bearer <token>` → a principal in a workspace with roles.
//! Tokens come from `[[api.tokens]]`. With none configured, every `/v1` call is refused.
//!
//! A delegated capability token (`sgd_…`, minted through `api::delegations`) authenticates
//! as its delegator *as the delegator is now* (roles re-read at every use), narrowed to
//! some actions on one sandbox. Only the sandbox-operation endpoints accept it
//! ([`ActionCaller`]); every other endpoint refuses it ([`Caller`]), so a delegation can
//! never reach further than what it names.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

pub use crate::base::{DelegationScope, Principal};
use crate::config::ApiTokenConfig;
use crate::error::ErrorReply;

/// Prefix of delegated capability tokens.
pub const DELEGATION_TOKEN_PREFIX: &str = "sgd_";

#[derive(Debug, thiserror::Error)]
#[error("config key `api.tokens[{index}].token_env`: environment variable {var} is not set")]
pub struct AuthConfigError {
    index: usize,
    var: String,
}

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
        let value = header?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.authenticate_secret(token.trim().as_bytes())
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

fn bearer(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

fn unauthenticated(message: &str) -> Response {
    let mut response = ErrorReply::new(
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
        message.to_string(),
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"sandgate\""),
    );
    response
}

/// Resolves a delegated token: live (not expired, not revoked) and its delegator still
/// configured; the principal returned carries the delegator's current roles.
async fn delegated(state: &super::ApiState, token: &str) -> Result<Arc<Principal>, Response> {
    let hash = crate::api::delegations::token_hash(token);
    let row = match state
        .sandboxes
        .store()
        .delegation_by_token_hash(&hash)
        .await
    {
        Ok(Some(row)) => row,
        Ok(None) => return Err(unauthenticated("unknown delegated token")),
        Err(e) => return Err(crate::create::internal(e).into_response()),
    };
    if row.revoked_ms.is_some() {
        return Err(unauthenticated("this delegated token was revoked"));
    }
    if crate::base::clock::now_ms() >= row.expires_ms {
        return Err(unauthenticated("this delegated token has expired"));
    }
    let Some(delegator) = state.auth.principal_named(&row.delegator, &row.workspace) else {
        return Err(unauthenticated(
            "the principal that delegated this token no longer exists",
        ));
    };
    Ok(Arc::new(Principal {
        principal: delegator.principal.clone(),
        workspace: delegator.workspace.clone(),
        roles: delegator.roles.clone(),
        delegation: Some(DelegationScope {
            id: row.id,
            agent: row.agent,
            sandbox_id: row.sandbox_id,
            actions: row.actions,
            expires_ms: row.expires_ms,
        }),
    }))
}

/// Like [`Caller`], and also accepts delegated tokens (for sandbox operations only).
pub struct ActionCaller(pub Arc<Principal>);

impl FromRequestParts<super::ApiState> for ActionCaller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &super::ApiState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get(header::AUTHORIZATION);
        match bearer(header) {
            Some(token) if token.starts_with(DELEGATION_TOKEN_PREFIX) => {
                delegated(state, token).await.map(ActionCaller)
            }
            _ => Caller::from_request_parts(parts, state)
                .await
                .map(|Caller(p)| ActionCaller(p)),
        }
    }
}

impl IntoResponse for ErrorReply {
    fn into_response(self) -> Response {
        self.to_response::<axum::body::Body>()
    }
}

/// Extracts the authenticated principal or answers 401.
pub struct Caller(pub Arc<Principal>);

impl FromRequestParts<super::ApiState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &super::ApiState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get(header::AUTHORIZATION);
        if bearer(header).is_some_and(|t| t.starts_with(DELEGATION_TOKEN_PREFIX)) {
            return Err(ErrorReply::new(
                StatusCode::FORBIDDEN,
                "delegation_scope",
                "a delegated token may only perform the actions it names on its sandbox",
            )
            .into_response());
        }
        match state.auth.authenticate(header) {
            Some(principal) => Ok(Caller(principal)),
            None => Err(unauthenticated(
                "send Authorization: Bearer <token> with a token from [[api.tokens]]",
            )),
        }
    }
}
