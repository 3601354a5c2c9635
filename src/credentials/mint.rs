//! What a token endpoint answers and how its failures are classified: the vocabulary the
//! minters ([`super::oauth2`], [`super::github`]) share with [`super::tokens`], which drives
//! them. It lives apart so the minters need not import the module that holds them.

use std::time::Duration;

use super::Secret;

/// What a token endpoint answered.
pub struct Fresh {
    pub token: Secret,
    /// How long the token lives from now.
    pub lifetime: Duration,
    /// A new refresh token, when the endpoint rotated it.
    pub rotated_refresh_token: Option<Secret>,
}

/// Why no token was obtained.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MintError {
    /// The endpoint refused the grant itself: retrying cannot help.
    #[error("{0}")]
    Rejected(String),
    /// A server error, a timeout, a network error: worth retrying.
    #[error("{0}")]
    Transient(String),
}

impl MintError {
    pub(super) fn outcome(&self) -> &'static str {
        match self {
            MintError::Rejected(_) => "rejected",
            MintError::Transient(_) => "transient_error",
        }
    }
}

/// Longest token endpoint answer read.
const MAX_RESPONSE: usize = 64 * 1024;

/// Reads at most [`MAX_RESPONSE`] bytes of a token endpoint's answer.
pub(super) async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, MintError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| MintError::Transient(describe_send_error(&e)))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE {
            return Err(MintError::Rejected(format!(
                "the token endpoint's answer is larger than {MAX_RESPONSE} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

pub(super) fn describe_send_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "the token endpoint did not answer in time".into()
    } else if e.is_connect() {
        format!(
            "cannot connect to the token endpoint: {}",
            crate::error::chain(e)
        )
    } else {
        format!("the token request failed: {}", crate::error::chain(e))
    }
}

/// At most `max` characters of `text`, without control characters (it goes into error
/// messages and logs).
pub(super) fn printable(text: &str, max: usize) -> String {
    text.chars().filter(|c| !c.is_control()).take(max).collect()
}
