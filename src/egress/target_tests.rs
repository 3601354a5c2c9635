//! The upstream URI built from parts is the one the text parses to.

use std::sync::Arc;

use proptest::prelude::*;

use super::Target;
use crate::identity::Identity;

fn target(host: &str, port: u16) -> Target {
    let identity = Identity::new("sbx", b"t".to_vec(), "ws", vec![], Default::default());
    Target::new(Arc::new(identity), host.to_string(), port)
}

/// The URI the proxy used to build: the text, parsed.
fn reference(scheme: &str, target: &Target, path: &str) -> Option<http::Uri> {
    format!("{scheme}://{}{path}", target.authority)
        .parse()
        .ok()
}

fn hosts() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("api.example.com".to_string()),
        Just("127.0.0.1".to_string()),
        Just("::1".to_string()),
        "[a-z0-9.-]{1,20}",
        // Whatever a CONNECT line could carry that still made a target.
        "[ -~]{1,12}",
    ]
}

proptest! {
    #[test]
    fn the_built_uri_is_the_parsed_one(
        host in hosts(),
        port in any::<u16>(),
        scheme in prop::sample::select(vec!["https", "http"]),
        path in prop_oneof!["/[ -~]{0,40}", "[ -~]{0,12}", "/[\\x00-\\u{ff}]{0,12}"],
    ) {
        let target = target(&host, port);
        let built = target.upstream_uri(scheme, &path);
        let parsed = reference(scheme, &target, &path);
        prop_assert_eq!(built.as_ref().map(ToString::to_string), parsed.as_ref().map(ToString::to_string));
        if let (Some(built), Some(parsed)) = (built, parsed) {
            prop_assert_eq!(built.scheme_str(), parsed.scheme_str());
            prop_assert_eq!(built.authority(), parsed.authority());
            prop_assert_eq!(built.path_and_query(), parsed.path_and_query());
        }
    }
}

#[test]
fn an_origin_form_path_keeps_its_query_and_port() {
    let target = target("api.example.com", 8443);
    let uri = target.upstream_uri("https", "/v1/x?a=1&b=%2F").unwrap();
    assert_eq!(
        uri.to_string(),
        "https://api.example.com:8443/v1/x?a=1&b=%2F"
    );
    let v6 = target_v6();
    assert_eq!(
        v6.upstream_uri("http", "/").unwrap().to_string(),
        "http://[::1]:80/"
    );
    assert!(
        target.upstream_uri("https", "/a b").is_none(),
        "a space is refused"
    );
}

fn target_v6() -> Target {
    target("::1", 80)
}
