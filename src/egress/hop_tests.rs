//! The request's naming of its destination and the hop-by-hop headers, without sockets.

use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Request};

use super::*;
use crate::error::Kind;
use crate::identity::Identity;

fn target(host: &str, port: u16) -> Target {
    let identity = Identity::new("sbx", b"t".to_vec(), "ws", vec![], Default::default());
    Target::new(Arc::new(identity), host.to_string(), port)
}

fn request(uri: &str, host: Option<&str>) -> Request<()> {
    let mut builder = Request::builder().uri(uri);
    if let Some(host) = host {
        builder = builder.header(header::HOST, host);
    }
    builder.body(()).unwrap()
}

#[test]
fn a_request_naming_its_tunnels_destination_passes() {
    let t = target("api.example.com", 443);
    for (uri, host) in [
        ("/x", Some("api.example.com")),
        ("/x", Some("API.Example.com.:443")),
        ("https://api.example.com/x", None),
        ("https://api.example.com:443/x", Some("api.example.com")),
    ] {
        assert!(
            check_authority(&request(uri, host), &t).is_ok(),
            "{uri} {host:?}"
        );
    }
}

#[test]
fn another_host_or_port_is_misdirected_and_no_host_is_a_bad_request() {
    let t = target("api.example.com", 443);
    for (uri, host) in [
        ("/x", Some("evil.example.net")),
        ("/x", Some("api.example.com:8443")),
        ("https://evil.example.net/x", Some("api.example.com")),
        ("/x", Some("api.example.com@evil")),
    ] {
        let e = check_authority(&request(uri, host), &t).unwrap_err();
        assert_eq!(e.kind, Kind::Misdirected, "{uri} {host:?}");
        assert_eq!(e.code, "misdirected_request");
        assert_eq!(e.details.host.as_deref(), Some("api.example.com"));
    }
    let e = check_authority(&request("/x", None), &t).unwrap_err();
    assert_eq!((e.kind, e.code), (Kind::Invalid, "bad_request"));
    let mut bad = request("/x", None);
    bad.headers_mut()
        .insert(header::HOST, HeaderValue::from_bytes(b"\xffhost").unwrap());
    let e = check_authority(&bad, &t).unwrap_err();
    assert_eq!(e.kind, Kind::Misdirected);
}

#[test]
fn hop_by_hop_headers_go_and_te_trailers_stays() {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONNECTION,
        HeaderValue::from_static("x-secret, keep-alive"),
    );
    headers.insert("x-secret", HeaderValue::from_static("1"));
    headers.insert(
        header::PROXY_AUTHORIZATION,
        HeaderValue::from_static("Basic x"),
    );
    headers.insert(header::TE, HeaderValue::from_static("gzip, trailers"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    strip_hop_by_hop(&mut headers, false);
    assert!(headers.get("x-secret").is_none());
    assert!(headers.get(header::PROXY_AUTHORIZATION).is_none());
    assert!(headers.get(header::CONNECTION).is_none());
    assert!(headers.get(header::UPGRADE).is_none());
    assert_eq!(headers[header::TE], "trailers");
    assert_eq!(headers[header::ACCEPT], "*/*");
}

proptest::proptest! {
    /// The shortcut changes nothing: with or without it, the same headers are left.
    #[test]
    fn hop_by_hop_headers_are_stripped_as_without_the_shortcut(
        fields in proptest::collection::vec(
            (
                proptest::sample::select(&[
                    "host", "accept", "connection", "upgrade", "te", "keep-alive",
                    "proxy-connection", "proxy-authorization", "proxy-authenticate",
                    "transfer-encoding", "x-drop-me", "content-length",
                ][..]),
                proptest::sample::select(&["trailers", "x-drop-me, keep-alive", "close", "1", ""][..]),
            ),
            0..6,
        ),
        keep_upgrade in proptest::bool::ANY,
    ) {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                http::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let mut reference = headers.clone();
        strip_named(&mut reference, keep_upgrade);
        strip_hop_by_hop(&mut headers, keep_upgrade);
        proptest::prop_assert_eq!(headers, reference);
    }
}
