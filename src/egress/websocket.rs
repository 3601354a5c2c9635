//! Upgraded streams (WebSockets): recognising them, translating an h2 WebSocket (RFC 8441
//! extended CONNECT) into the HTTP/1.1 handshake it stands for, and splicing the two
//! upgraded sides together for as long as the identity stays live.

use std::time::Duration;

use base64::Engine as _;
use http::{header, HeaderValue, Method, Request, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use super::limits::Hold;

/// An RFC 8441 extended CONNECT for a WebSocket.
pub(crate) fn is_h2_websocket(req: &Request<Incoming>) -> bool {
    req.version() == Version::HTTP_2
        && req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// The method a request goes upstream with: an h2 WebSocket becomes the h1 `GET`
/// handshake, so policy and credentials judge what is forwarded.
pub(crate) fn forwarded_method(req: &Request<Incoming>) -> &str {
    if is_h2_websocket(req) {
        "GET"
    } else {
        req.method().as_str()
    }
}

/// An HTTP/1.1 `Upgrade` request.
pub(crate) fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.version() == Version::HTTP_11
        && req.method() == Method::GET
        && req.headers().contains_key(header::UPGRADE)
        && req.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.to_ascii_lowercase().contains("upgrade"))
        })
}

/// Turns an h2 WebSocket request into the HTTP/1.1 handshake; returns the key sandgate made,
/// which the origin's `Sec-WebSocket-Accept` must answer.
pub(crate) fn to_h1_handshake(parts: &mut http::request::Parts) -> String {
    let key = websocket_key();
    parts.method = Method::GET;
    parts.extensions.remove::<hyper::ext::Protocol>();
    let headers = &mut parts.headers;
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(value) = HeaderValue::from_str(&key) {
        headers.insert(header::SEC_WEBSOCKET_KEY, value);
    }
    headers
        .entry(header::SEC_WEBSOCKET_VERSION)
        .or_insert(HeaderValue::from_static("13"));
    key
}

/// Whether the origin's answer to an h1 handshake made from `key` is the right one.
pub(crate) fn accepted(headers: &http::HeaderMap, key: &str) -> bool {
    headers
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .is_some_and(|v| v.as_bytes() == websocket_accept(key).as_bytes())
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64.
fn websocket_key() -> String {
    let mut bytes = [0u8; 16];
    crate::tls::ca::rand_bytes(&mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `Sec-WebSocket-Accept` an origin must answer `key` with (RFC 6455 section 4.2.2).
fn websocket_accept(key: &str) -> String {
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// Copies between the two upgraded sides until either ends, `max` passes, or the identity
/// is revoked; `hold` keeps the stream counted against the proxy's limits meanwhile.
pub(crate) fn splice(
    client: hyper::upgrade::OnUpgrade,
    server: hyper::upgrade::OnUpgrade,
    max: Duration,
    revoked: CancellationToken,
    hold: Hold,
) {
    tokio::spawn(async move {
        // The stream counts against the limits its connection and tunnel did.
        let _hold = hold;
        let (Ok(client), Ok(server)) = (client.await, server.await) else {
            tracing::debug!("upgrade did not complete on both sides");
            return;
        };
        let mut client = TokioIo::new(client);
        let mut server = TokioIo::new(server);
        tokio::select! {
            _ = tokio::time::timeout(max, tokio::io::copy_bidirectional(&mut client, &mut server)) => {}
            () = revoked.cancelled() => {
                tracing::debug!("upgraded stream ended: its identity was revoked");
            }
        }
    });
}
