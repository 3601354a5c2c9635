//! The failure table, options, bodies and tags.

use std::sync::Arc;

use super::wire::{instance_of, SandboxView};
use super::*;
use crate::providers::hosted::errors::test_failure;
use crate::providers::Tags;

fn failure(status: Option<u16>, body: Value) -> HttpFailure {
    test_failure(status, body, true)
}

#[test]
fn the_failure_table() {
    let said = |m: &str| json!({"errors": [m], "success": false});
    let cases = [
        (400, said("Invalid tier"), ErrorClass::InvalidRequest),
        (422, said("title is too long"), ErrorClass::InvalidRequest),
        (401, said("Unauthorized"), ErrorClass::UnboundAccount),
        (403, json!({}), ErrorClass::UnboundAccount),
        (402, said("Upgrade your plan"), ErrorClass::Billing),
        (404, said("Sandbox not found"), ErrorClass::Unsupported),
        (408, json!({}), ErrorClass::Unknown),
        (409, said("conflict"), ErrorClass::ProviderError),
        (429, said("Too many requests"), ErrorClass::RateLimit),
        (500, json!({}), ErrorClass::ProviderError),
        (502, json!({}), ErrorClass::Outage),
        (503, said("overloaded"), ErrorClass::Capacity),
        (504, json!({}), ErrorClass::Unknown),
    ];
    for (status, body, class) in cases {
        assert_eq!(
            classify(&failure(Some(status), body.clone())),
            class,
            "{status} {body}"
        );
    }
    assert_eq!(
        classify(&test_failure(None, json!(null), false)),
        ErrorClass::Outage
    );
    assert_eq!(
        classify(&test_failure(None, json!(null), true)),
        ErrorClass::Unknown
    );
    // A refusal made nothing; a server error may have forked the sandbox.
    assert!(
        !ERRORS
            .create_error(failure(Some(429), said("slow")))
            .maybe_created
    );
    assert!(
        ERRORS
            .create_error(failure(Some(503), said("busy")))
            .maybe_created
    );
    // The provider's first error is part of the message.
    let mut f = failure(Some(404), said("Sandbox not found"));
    f.message = "codesandbox answered 404 Not Found".into();
    assert_eq!(
        ERRORS.provider_error(f).message,
        "codesandbox answered 404 Not Found: Sandbox not found"
    );
    let f = failure(Some(404), json!({}));
    assert_eq!(ERRORS.op_error(f).kind, OpErrorKind::NotFound);
}

fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn options_are_checked_and_named() {
    let key = || Secret::new("csb_k".to_string());
    let a = CodesandboxAccount::from_options(None, &options(&[]), key()).unwrap();
    assert_eq!(a.base_url, DEFAULT_BASE_URL);
    assert_eq!(a.template, DEFAULT_TEMPLATE);
    assert_eq!((a.tier, a.hibernation_timeout_secs), (None, None));
    let a = CodesandboxAccount::from_options(
        Some("http://127.0.0.1:9"),
        &options(&[
            ("template", "abc123"),
            ("tier", "Small"),
            ("hibernation_timeout_secs", "600"),
        ]),
        key(),
    )
    .unwrap();
    assert_eq!(a.base_url, "http://127.0.0.1:9");
    assert_eq!(a.tier.as_deref(), Some("Small"));
    assert_eq!(a.hibernation_timeout_secs, Some(600));
    for (pairs, field) in [
        (vec![("tier", "Huge")], "options.tier"),
        (vec![("template", "a/b")], "options.template"),
        (
            vec![("hibernation_timeout_secs", "86401")],
            "options.hibernation_timeout_secs",
        ),
        (
            vec![("hibernation_timeout_secs", "0")],
            "options.hibernation_timeout_secs",
        ),
        (vec![("image", "x")], "options.image"),
    ] {
        let err = CodesandboxAccount::from_options(None, &options(&pairs), key()).unwrap_err();
        assert_eq!(err.0, field, "{pairs:?}");
    }
}

fn adapter(pairs: &[(&str, &str)]) -> Codesandbox {
    let account = CodesandboxAccount::from_options(
        Some("http://127.0.0.1:9"),
        &options(pairs),
        Secret::new("csb_k".to_string()),
    )
    .unwrap();
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    Codesandbox::new(account, tls).unwrap()
}

fn spec(source: Option<sandgate_router::Source>, snapshot: Option<&str>) -> CreateSpec {
    let request = sandgate_router::Request {
        source,
        ..sandgate_router::Request::default()
    };
    CreateSpec {
        tags: Tags {
            sandbox_id: "sb-1".into(),
            attempt_id: "sb-1-a1".into(),
        },
        pool: "csb".into(),
        account: "csb".into(),
        request: Arc::new(request),
        env: BTreeMap::new(),
        snapshot: snapshot.map(str::to_string),
        egress: None,
    }
}

#[test]
fn what_a_create_forks_and_sends() {
    use sandgate_router::Source;
    let a = adapter(&[("tier", "Nano"), ("hibernation_timeout_secs", "120")]);
    assert_eq!(a.source(&spec(None, None)).unwrap(), DEFAULT_TEMPLATE);
    let env = Source::Environment("metal/base".into());
    assert_eq!(a.source(&spec(Some(env), None)).unwrap(), DEFAULT_TEMPLATE);
    let t = Source::Template("tmpl-1".into());
    assert_eq!(a.source(&spec(Some(t.clone()), None)).unwrap(), "tmpl-1");
    assert_eq!(a.source(&spec(Some(t), Some("snap9"))).unwrap(), "snap9");
    let image = a.source(&spec(Some(Source::Image("alpine".into())), None));
    assert_eq!(image.unwrap_err().class, ErrorClass::Unsupported);
    let odd = a.source(&spec(Some(Source::Template("../x".into())), None));
    assert_eq!(odd.unwrap_err().class, ErrorClass::InvalidRequest);
    let body = Codesandbox::fork_body(&spec(None, None));
    assert_eq!(
        body["tags"],
        json!(["sandgate_sandbox=sb-1", "sandgate_attempt=sb-1-a1"])
    );
    assert_eq!(body["privacy"], 2);
    assert_eq!(body["private_preview"], true);
    assert_eq!(
        a.start_body(),
        json!({"tier": "Nano", "hibernation_timeout_seconds": 120})
    );
    assert_eq!(adapter(&[]).start_body(), json!({}));
}

#[test]
fn tags_are_read_back() {
    let view = SandboxView {
        id: "abc".into(),
        tags: vec![
            "sdk".into(),
            "sandgate_sandbox=sb-1".into(),
            "sandgate_attempt=sb-1-a2".into(),
        ],
    };
    let instance = instance_of(&view);
    assert_eq!(instance.tags.sandbox_id, "sb-1");
    assert_eq!(instance.tags.attempt_id, "sb-1-a2");
    assert_eq!(tag_strings(&instance.tags), view.tags[1..].to_vec());
}

#[test]
fn a_lockdown_is_refused_and_the_kind_is_advisory() {
    const { assert!(!LOCKS_DOWN) };
    assert!(!crate::providers::hosted::locks_to_gateway(
        sandgate_router::ProviderKind::Codesandbox
    ));
    assert_eq!(lockdown_refusal().class, ErrorClass::Unsupported);
    const { assert!(CAPABILITIES.pause_resume && !CAPABILITIES.process_execute) };
    const { assert!(!CAPABILITIES.filesystem_read && !CAPABILITIES.filesystem_write) };
}
