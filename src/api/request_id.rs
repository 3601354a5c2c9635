//! `X-Request-Id`: every API answer carries one, so a caller (and the SDKs' error types) can
//! quote the request when reporting a problem, and the server's log lines about it carry the
//! same id (the `api.request` span of [`super::traced`], opened inside this layer).
//!
//! A caller's own id is kept when it is a plain token (1 to 128 of `A-Z a-z 0-9 . _ : -`), so
//! an id minted upstream (a load balancer, a tracing client) follows the request through;
//! anything else (too long, spaces, control or non-ASCII bytes) is replaced by a fresh
//! `req-<uuid>` rather than echoed, since the header is caller input that reaches logs.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

pub const HEADER: &str = "x-request-id";
const MAX_LEN: usize = 128;

/// The caller's id when it is a plain token, else a new one.
pub fn pick(offered: Option<&HeaderValue>) -> String {
    offered
        .and_then(|v| v.to_str().ok())
        .filter(|s| is_plain_token(s))
        .map(str::to_string)
        .unwrap_or_else(|| format!("req-{}", crate::decision_log::new_decision_id()))
}

fn is_plain_token(s: &str) -> bool {
    (1..=MAX_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The middleware: picks the id, puts it on the request (where the span reads it) and on the
/// answer (errors included: it runs outside the error-shape net).
pub async fn layer(mut request: Request, next: Next) -> Response {
    let id = pick(request.headers().get(HEADER));
    let value = HeaderValue::from_str(&id).expect("a plain token is a valid header value");
    request.headers_mut().insert(HEADER, value.clone());
    let mut response = next.run(request).await;
    response.headers_mut().insert(HEADER, value);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tokens_are_kept_and_anything_else_is_replaced() {
        let keep = HeaderValue::from_static("abc-123_x.y:z");
        assert_eq!(pick(Some(&keep)), "abc-123_x.y:z");
        for bad in ["", "has space", "semi;colon", &"a".repeat(129)] {
            let v = HeaderValue::from_str(bad).unwrap();
            let picked = pick(Some(&v));
            assert!(
                picked.starts_with("req-") && picked.len() == 40,
                "{bad:?} -> {picked}"
            );
        }
        let non_utf8 = HeaderValue::from_bytes(b"\xff\xfe").unwrap();
        assert!(pick(Some(&non_utf8)).starts_with("req-"));
        assert_ne!(pick(None), pick(None));
    }
}
