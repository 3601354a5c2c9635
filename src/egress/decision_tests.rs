//! The proxy's refusals as domain errors and as the proxy answers them, without sockets.

use std::sync::Arc;

use http::StatusCode;

use super::*;
use crate::error::{Blame, Kind};
use crate::identity::Identity;
use crate::reply::ErrorReply;

fn target() -> Target {
    let identity = Identity::new("sbx", b"t".to_vec(), "ws", vec![], Default::default());
    Target::new(Arc::new(identity), "api.example.com".into(), 443)
}

#[test]
fn a_policy_denial_is_the_sandboxs_refusal_with_its_reasons() {
    let e = egress_denied(&target(), &["not on the list".to_string()]);
    assert_eq!(
        (e.kind, e.code, e.blame),
        (Kind::Refused, "egress_denied", Blame::Sandbox)
    );
    assert_eq!(e.reasons_or_message(), vec!["not on the list"]);
    let reply = ErrorReply::proxy(e);
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(
        reply.body()["error"]["details"],
        serde_json::json!({"host": "api.example.com", "port": 443, "reasons": ["not on the list"]})
    );
}

#[test]
fn a_forbidden_address_and_a_failed_lookup_differ_in_kind_and_blame() {
    let t = target();
    let forbidden = crate::net::resolve::ResolveError::Forbidden {
        host: "api.example.com".into(),
        ip: "169.254.169.254".parse().unwrap(),
        why: crate::net::guard::Forbidden::LinkLocal,
    };
    let e = resolve_error(&t, &forbidden);
    assert_eq!((e.kind, e.code), (Kind::Forbidden, "destination_forbidden"));
    assert_eq!(e.details.ip.as_deref(), Some("169.254.169.254"));
    let lookup = crate::net::resolve::ResolveError::Lookup {
        host: "api.example.com".into(),
        reason: "no such name".into(),
    };
    let e = resolve_error(&t, &lookup);
    assert_eq!(
        (e.kind, e.code, e.blame),
        (Kind::Upstream, "dns_failed", Blame::Upstream)
    );
    assert_eq!(ErrorReply::proxy(e).status, StatusCode::BAD_GATEWAY);
}

#[test]
fn an_inactive_sandbox_and_a_placeholder_destination_are_refused() {
    let e = sandbox_inactive("sbx-1");
    assert_eq!((e.kind, e.code), (Kind::Forbidden, "sandbox_inactive"));
    let e = placeholder_in_destination(443);
    assert_eq!(e.code, "credential_destination_mismatch");
    assert_eq!(e.details.port, Some(443));
    assert!(
        e.details.host.is_none(),
        "the name carrying a placeholder is not echoed"
    );
}
