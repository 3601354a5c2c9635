//! API callers: `Authorization: Bearer <token>` → a principal in a workspace with roles.
//! Tokens come from `[[api.tokens]]`. With none configured, every `/v1` call is refused.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::config::ApiTokenConfig;
use crate::error::ErrorReply;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Principal {
    pub principal: String,
    pub workspace: String,
    pub roles: Vec<String>,
}

impl Principal {
    pub fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| r == "admin")
    }

    /// Whether the principal may manage resources of `workspace`: its own, or any for a
    /// platform admin.
    pub fn may_manage(&self, workspace: &str) -> bool {
        self.workspace == workspace || self.is_admin()
    }
}

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
                }),
            ));
        }
        Ok(ApiAuth { tokens: out })
    }

    /// Compares against every token in constant time, so timing reveals nothing.
    pub fn authenticate(&self, header: Option<&HeaderValue>) -> Option<Arc<Principal>> {
        let value = header?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let token = token.trim().as_bytes();
        let mut found = None;
        for (candidate, principal) in &self.tokens {
            if bool::from(candidate.as_slice().ct_eq(token)) {
                found = Some(principal.clone());
            }
        }
        found
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
        match state
            .auth
            .authenticate(parts.headers.get(header::AUTHORIZATION))
        {
            Some(principal) => Ok(Caller(principal)),
            None => {
                let mut response = ErrorReply::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "send Authorization: Bearer <token> with a token from [[api.tokens]]",
                )
                .into_response();
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"sandgate\""),
                );
                Err(response)
            }
        }
    }
}
