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
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::callers::bearer;
pub use crate::callers::{
    local_admin_principal, local_secret, ApiAuth, AuthConfigError, DelegationScope, Principal,
    DELEGATION_TOKEN_PREFIX,
};
use crate::error::{Error, Kind};

fn unauthenticated(message: &str) -> Response {
    let mut response = Error::new(
        Kind::Unauthenticated,
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

/// Resolves a delegated token ([`crate::operations::delegation::resolve_delegated`]); a
/// refusal carries `WWW-Authenticate` like every other 401.
async fn delegated(state: &super::ApiState, token: &str) -> Result<Arc<Principal>, Response> {
    crate::operations::delegation::resolve_delegated(&state.ops, token)
        .await
        .map_err(|e| match e.kind {
            Kind::Unauthenticated => unauthenticated(&e.message),
            _ => e.into_response(),
        })
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
            return Err(Error::new(
                Kind::Forbidden,
                "delegation_scope",
                "a delegated token may only perform the actions it names on its sandbox",
            )
            .into_response());
        }
        match state.ops.auth.authenticate(header) {
            Some(principal) => Ok(Caller(principal)),
            None => Err(unauthenticated(
                "send Authorization: Bearer <token> with a token from [[api.tokens]]",
            )),
        }
    }
}
