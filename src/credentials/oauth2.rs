//! OAuth2 access tokens obtained by sandgate (RFC 6749 §4.4 client credentials and §6
//! refresh), applied as `Authorization: Bearer` (RFC 6750) outside the sandbox.
//!
//! Contract:
//! - The secret is the client secret (`client_credentials`), the refresh token
//!   (`refresh_token`, a public client), or the JSON document
//!   `{"client_secret"?, "refresh_token"?}` (a confidential client refreshing).
//! - The token request is a form POST to `token_url` (HTTPS only), the client
//!   authenticating with HTTP Basic (`client_auth = "basic"`, the default, both parts
//!   form-encoded as §2.3.1 says) or in the body (`"post"`); a client without a secret sends
//!   its `client_id` in the body.
//! - Classification: an error response naming `invalid_grant`, `invalid_client`,
//!   `unauthorized_client`, `unsupported_grant_type` or `invalid_scope`, and any other 4xx
//!   but 408/429, is [`MintError::Rejected`] (the credential ends); 408, 429, 5xx, timeouts
//!   and network errors are [`MintError::Transient`] (retried). The endpoint's
//!   `error_description` is kept short and printable, and never a token.
//! - A missing `expires_in` is taken as 15 minutes, so an unknown lifetime is refreshed
//!   early rather than used past its end.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::mint::{describe_send_error, printable, read_bounded, Fresh, MintError};
use super::Secret;

/// The grant sandgate uses at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    ClientCredentials,
    RefreshToken,
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// `Authorization: Basic` (RFC 6749 `client_secret_basic`).
    #[default]
    Basic,
    /// `client_id` and `client_secret` in the form body (`client_secret_post`).
    Post,
}

/// Lifetime assumed when the endpoint does not say.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(900);
/// One token request's deadline.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks the `apply` fields; errors are `(field, message)`.
pub fn validate(
    token_url: &str,
    client_id: &str,
    scopes: &[String],
) -> Result<(), (&'static str, String)> {
    match url::Url::parse(token_url) {
        Ok(url) if url.scheme() == "https" && url.host_str().is_some() => {}
        _ => return Err(("apply.token_url", "must be an https:// URL".into())),
    }
    if client_id.is_empty() || client_id.len() > 512 || client_id.chars().any(char::is_control) {
        return Err((
            "apply.client_id",
            "must be 1-512 printable characters".into(),
        ));
    }
    if scopes.len() > 64
        || scopes
            .iter()
            .any(|s| s.is_empty() || s.len() > 256 || s.chars().any(|c| c == ' ' || c.is_control()))
    {
        return Err((
            "apply.scopes",
            "at most 64 scopes, each 1-256 printable characters without spaces".into(),
        ));
    }
    Ok(())
}

/// The secret parts of an OAuth2 credential.
pub struct ClientSecrets {
    pub client_secret: Option<Secret>,
    pub refresh_token: Option<Secret>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretDocument {
    #[serde(default)]
    client_secret: Option<String>,
    #[serde(default)]
    refresh_token: Option<String>,
}

impl ClientSecrets {
    /// Reads the secret as `grant` needs it; the message never quotes it.
    pub fn parse(grant: Grant, secret: &Secret) -> Result<ClientSecrets, String> {
        let text = secret.expose();
        let (client_secret, refresh_token) = if text.trim_start().starts_with('{') {
            let doc: SecretDocument = serde_json::from_str(text).map_err(|_| {
                "the secret is not the JSON document {\"client_secret\"?, \"refresh_token\"?}"
                    .to_string()
            })?;
            (doc.client_secret, doc.refresh_token)
        } else {
            match grant {
                Grant::ClientCredentials => (Some(text.to_string()), None),
                Grant::RefreshToken => (None, Some(text.to_string())),
            }
        };
        let nonempty = |v: Option<String>| v.filter(|v| !v.is_empty()).map(Secret::new);
        let secrets = ClientSecrets {
            client_secret: nonempty(client_secret),
            refresh_token: nonempty(refresh_token),
        };
        match grant {
            Grant::ClientCredentials if secrets.client_secret.is_none() => {
                Err("the client_credentials grant needs a client secret".into())
            }
            Grant::RefreshToken if secrets.refresh_token.is_none() => {
                Err("the refresh_token grant needs a refresh token".into())
            }
            _ => Ok(secrets),
        }
    }
}

/// One OAuth2 client at one token endpoint.
pub struct Client {
    pub grant: Grant,
    pub token_url: String,
    pub client_id: String,
    pub client_secret: Option<Secret>,
    pub scopes: Vec<String>,
    pub client_auth: ClientAuth,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
    #[serde(default)]
    refresh_token: Option<String>,
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

impl Client {
    pub fn uses_refresh_token(&self) -> bool {
        self.grant == Grant::RefreshToken
    }

    /// One token request (the caller retries transient failures).
    pub async fn mint(
        &self,
        http: &reqwest::Client,
        refresh_token: Option<&Secret>,
    ) -> Result<Fresh, MintError> {
        let mut form: Vec<(&str, &str)> = Vec::new();
        match self.grant {
            Grant::ClientCredentials => form.push(("grant_type", "client_credentials")),
            Grant::RefreshToken => {
                let token = refresh_token.ok_or_else(|| {
                    MintError::Rejected("the credential holds no refresh token".into())
                })?;
                form.push(("grant_type", "refresh_token"));
                form.push(("refresh_token", token.expose()));
            }
        }
        let scope = self.scopes.join(" ");
        if !scope.is_empty() {
            form.push(("scope", &scope));
        }
        let mut request = http
            .post(&self.token_url)
            .header(http::header::ACCEPT, "application/json")
            .timeout(ATTEMPT_TIMEOUT);
        match (&self.client_secret, self.client_auth) {
            (Some(secret), ClientAuth::Basic) => {
                request = request.basic_auth(
                    form_encode(&self.client_id),
                    Some(form_encode(secret.expose())),
                );
            }
            (Some(secret), ClientAuth::Post) => {
                form.push(("client_id", &self.client_id));
                form.push(("client_secret", secret.expose()));
            }
            (None, _) => form.push(("client_id", &self.client_id)),
        }
        let response = request
            .form(&form)
            .send()
            .await
            .map_err(|e| MintError::Transient(describe_send_error(&e)))?;
        let status = response.status();
        let body = read_bounded(response).await?;
        if status.is_success() {
            return parse_token(&body);
        }
        Err(classify_failure(status, &body))
    }
}

fn form_encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn parse_token(body: &[u8]) -> Result<Fresh, MintError> {
    let parsed: TokenResponse = serde_json::from_slice(body).map_err(|_| {
        MintError::Transient("the token endpoint's answer is not a token response".into())
    })?;
    if parsed
        .token_type
        .as_deref()
        .is_some_and(|t| !t.eq_ignore_ascii_case("bearer"))
    {
        return Err(MintError::Rejected(
            "the token endpoint issued a token that is not a Bearer token".into(),
        ));
    }
    if parsed.access_token.is_empty() || http::HeaderValue::from_str(&parsed.access_token).is_err()
    {
        return Err(MintError::Rejected(
            "the token endpoint's access token cannot be sent in a header".into(),
        ));
    }
    let lifetime = match &parsed.expires_in {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.parse().ok(),
        _ => None,
    }
    .map_or(DEFAULT_LIFETIME, Duration::from_secs);
    Ok(Fresh {
        token: Secret::new(parsed.access_token),
        lifetime,
        rotated_refresh_token: parsed
            .refresh_token
            .filter(|t| !t.is_empty())
            .map(Secret::new),
    })
}

fn classify_failure(status: reqwest::StatusCode, body: &[u8]) -> MintError {
    let parsed: Option<ErrorResponse> = serde_json::from_slice(body).ok();
    let what = match &parsed {
        Some(e) => match e.error_description.as_deref() {
            Some(d) => format!("{}: {}", printable(&e.error, 64), printable(d, 200)),
            None => printable(&e.error, 64),
        },
        None => format!("HTTP {}", status.as_u16()),
    };
    let transient = status.is_server_error()
        || status == reqwest::StatusCode::REQUEST_TIMEOUT
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
    if transient {
        MintError::Transient(format!(
            "the token endpoint answered {}: {what}",
            status.as_u16()
        ))
    } else {
        MintError::Rejected(what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_follow_the_grant() {
        let plain = Secret::new("abc");
        let cc = ClientSecrets::parse(Grant::ClientCredentials, &plain).unwrap();
        assert_eq!(cc.client_secret.unwrap().expose(), "abc");
        let rt = ClientSecrets::parse(Grant::RefreshToken, &plain).unwrap();
        assert_eq!(rt.refresh_token.unwrap().expose(), "abc");
        let doc = Secret::new(r#"{"client_secret":"s","refresh_token":"r"}"#);
        let both = ClientSecrets::parse(Grant::RefreshToken, &doc).unwrap();
        assert_eq!(both.client_secret.unwrap().expose(), "s");
        let missing = Secret::new(r#"{"client_secret":"s"}"#);
        assert!(ClientSecrets::parse(Grant::RefreshToken, &missing).is_err());
        let err = ClientSecrets::parse(Grant::RefreshToken, &Secret::new("{oops s3cr3t"))
            .err()
            .unwrap();
        assert!(!err.contains("s3cr3t"));
    }

    #[test]
    fn failures_are_classified() {
        let body = br#"{"error":"invalid_grant","error_description":"expired\n"}"#;
        let e = classify_failure(reqwest::StatusCode::BAD_REQUEST, body);
        assert!(
            matches!(&e, MintError::Rejected(m) if m == "invalid_grant: expired"),
            "{e}"
        );
        for status in [500, 503, 429, 408] {
            let status = reqwest::StatusCode::from_u16(status).unwrap();
            assert!(matches!(
                classify_failure(status, b""),
                MintError::Transient(_)
            ));
        }
        assert!(matches!(
            classify_failure(reqwest::StatusCode::NOT_FOUND, b"<html>"),
            MintError::Rejected(_)
        ));
    }

    #[test]
    fn token_responses_are_checked() {
        let ok = parse_token(
            br#"{"access_token":"t","token_type":"bearer","expires_in":"60","refresh_token":"r2"}"#,
        )
        .unwrap();
        assert_eq!(ok.lifetime, Duration::from_secs(60));
        assert_eq!(ok.rotated_refresh_token.unwrap().expose(), "r2");
        let default = parse_token(br#"{"access_token":"t"}"#).unwrap();
        assert_eq!(default.lifetime, DEFAULT_LIFETIME);
        assert!(parse_token(br#"{"access_token":"t","token_type":"mac"}"#).is_err());
        assert!(parse_token(b"{\"access_token\":\"a\\nb\"}").is_err());
    }

    #[test]
    fn only_https_token_urls() {
        assert!(validate("https://auth.example/token", "c", &[]).is_ok());
        assert!(validate("http://auth.example/token", "c", &[]).is_err());
        assert!(validate("https://auth.example/token", "", &[]).is_err());
        assert!(validate("https://a/t", "c", &["a b".into()]).is_err());
    }
}
