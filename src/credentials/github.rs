//! GitHub App installation tokens, minted outside the sandbox.
//!
//! Contract:
//! - The secret is the App's private key (the PEM GitHub issues, PKCS#1 or PKCS#8 RSA).
//! - To mint, sandgate signs a JWT (RS256; `iss` the App id, `iat` a minute in the past
//!   against clock drift, `exp` nine minutes ahead: GitHub allows at most ten) and exchanges
//!   it at `POST {api_url}/app/installations/{installation_id}/access_tokens` for an
//!   installation token, which lives about an hour and is refreshed before it ends (see
//!   [`super::tokens`]).
//! - Applied as `Authorization: Bearer <token>` to API requests and as
//!   `Authorization: Basic base64("x-access-token:<token>")` to git's smart HTTP and LFS
//!   paths, which is what github.com (and GitHub Enterprise Server, where API and git share a
//!   host) accept from git: so `git clone https://github.com/org/private` works from a
//!   sandbox that holds no token at all.
//! - 429 and 5xx answers are transient; other refusals (bad key, unknown App or
//!   installation, suspended installation) end the credential.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::mint::{describe_send_error, printable, read_bounded, Fresh, MintError};
use super::Secret;

/// The `api_url` default.
pub fn default_api_url() -> String {
    "https://api.github.com".into()
}

/// The username GitHub expects in front of an installation token in `Basic` auth.
pub const BASIC_USERNAME: &str = "x-access-token";

/// Checks the `apply` fields; errors are `(field, message)`.
pub fn validate(api_url: &str) -> Result<(), (&'static str, String)> {
    match url::Url::parse(api_url) {
        Ok(url) if url.scheme() == "https" && url.host_str().is_some() && url.query().is_none() => {
            Ok(())
        }
        _ => Err((
            "apply.api_url",
            "must be an https:// URL without a query".into(),
        )),
    }
}

/// One App installation and the key that speaks for the App.
pub struct App {
    pub app_id: u64,
    pub installation_id: u64,
    pub api_url: String,
    key: jsonwebtoken::EncodingKey,
}

#[derive(Serialize)]
struct Claims {
    iat: u64,
    exp: u64,
    iss: u64,
}

#[derive(Deserialize)]
struct InstallationToken {
    token: String,
    expires_at: String,
}

impl App {
    /// Reads the private key; the message never quotes it.
    pub fn new(
        app_id: u64,
        installation_id: u64,
        api_url: &str,
        private_key: &Secret,
    ) -> Result<App, String> {
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key.expose().as_bytes())
            .map_err(|_| "the secret is not an RSA private key in PEM form".to_string())?;
        Ok(App {
            app_id,
            installation_id,
            api_url: api_url.trim_end_matches('/').to_string(),
            key,
        })
    }

    /// The JWT that authenticates as the App, valid for nine minutes.
    fn jwt(&self) -> Result<String, MintError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = Claims {
            iat: now.saturating_sub(60),
            exp: now + 540,
            iss: self.app_id,
        };
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| MintError::Rejected(format!("cannot sign the App's JWT: {e}")))
    }

    /// One exchange of a fresh JWT for an installation token.
    pub async fn mint(&self, http: &reqwest::Client) -> Result<Fresh, MintError> {
        let url = format!(
            "{}/app/installations/{}/access_tokens",
            self.api_url, self.installation_id
        );
        let response = http
            .post(url)
            .bearer_auth(self.jwt()?)
            .header(http::header::ACCEPT, "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| MintError::Transient(describe_send_error(&e)))?;
        let status = response.status();
        let body = read_bounded(response).await?;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(|m| printable(m, 200)))
                .unwrap_or_default();
            let what = format!(
                "GitHub answered {} to the installation token request: {message}",
                status.as_u16()
            );
            let transient =
                status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
            return Err(match transient {
                true => MintError::Transient(what),
                false => MintError::Rejected(what),
            });
        }
        parse_token(&body)
    }
}

fn parse_token(body: &[u8]) -> Result<Fresh, MintError> {
    let parsed: InstallationToken = serde_json::from_slice(body)
        .map_err(|_| MintError::Transient("GitHub's answer is not an installation token".into()))?;
    if parsed.token.is_empty() || http::HeaderValue::from_str(&parsed.token).is_err() {
        return Err(MintError::Rejected(
            "GitHub's installation token cannot be sent in a header".into(),
        ));
    }
    let expires = time::OffsetDateTime::parse(
        &parsed.expires_at,
        &time::format_description::well_known::Rfc3339,
    )
    .map_err(|_| MintError::Transient("GitHub's expires_at is not a timestamp".into()))?;
    let lifetime = (expires - time::OffsetDateTime::now_utc())
        .try_into()
        .unwrap_or(Duration::ZERO);
    Ok(Fresh {
        token: Secret::new(parsed.token),
        lifetime,
        rotated_refresh_token: None,
    })
}

/// Whether `path` is one of git's smart HTTP (or LFS) paths, which take `Basic` auth.
pub fn is_git_path(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    path.ends_with("/info/refs")
        || path.ends_with("/git-upload-pack")
        || path.ends_with("/git-receive-pack")
        || path.contains("/info/lfs/")
}

/// The `Authorization` value for `token` on a request to `path`.
pub fn authorization(token: &Secret, path: &str) -> String {
    if is_git_path(path) {
        let pair = format!("{BASIC_USERNAME}:{}", token.expose());
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    } else {
        format!("Bearer {}", token.expose())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_paths_take_basic() {
        assert!(is_git_path(
            "/acme/private.git/info/refs?service=git-upload-pack"
        ));
        assert!(is_git_path("/acme/private/git-upload-pack"));
        assert!(is_git_path("/acme/p.git/info/lfs/objects/batch"));
        assert!(!is_git_path("/repos/acme/private"));
        let token = Secret::new("ghs_x");
        assert_eq!(authorization(&token, "/repos/a/b"), "Bearer ghs_x");
        assert!(authorization(&token, "/a/b.git/info/refs").starts_with("Basic "));
    }

    #[test]
    fn a_bad_key_is_refused_without_quoting_it() {
        let err = App::new(
            1,
            2,
            "https://api.github.com",
            &Secret::new("not a key s3cr3t"),
        )
        .err()
        .unwrap();
        assert!(!err.contains("s3cr3t"));
    }

    #[test]
    fn installation_tokens_are_read() {
        let at = (time::OffsetDateTime::now_utc() + time::Duration::minutes(60))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let body = format!(r#"{{"token":"ghs_abc","expires_at":"{at}"}}"#);
        let fresh = parse_token(body.as_bytes()).unwrap();
        assert!(fresh.lifetime > Duration::from_secs(3500));
        assert!(parse_token(br#"{"token":"a\nb","expires_at":"x"}"#).is_err());
    }
}
