//! The failure table, policies, options and SSE parsing.

use super::exec::{parse_event, split_event};
use super::*;

fn failure(status: Option<u16>, sent: bool) -> HttpFailure {
    crate::providers::hosted::errors::test_failure(status, json!({"message": "x"}), sent)
}

#[test]
fn the_failure_table() {
    let cases = [
        (Some(400), ErrorClass::InvalidRequest),
        (Some(422), ErrorClass::InvalidRequest),
        (Some(401), ErrorClass::UnboundAccount),
        (Some(403), ErrorClass::UnboundAccount),
        (Some(404), ErrorClass::Unsupported),
        (Some(408), ErrorClass::Unknown),
        (Some(409), ErrorClass::ProviderError),
        (Some(429), ErrorClass::RateLimit),
        (Some(500), ErrorClass::ProviderError),
        (Some(502), ErrorClass::Outage),
        (Some(503), ErrorClass::Outage),
        (Some(504), ErrorClass::Unknown),
    ];
    for (status, class) in cases {
        assert_eq!(classify(&failure(status, true)), class, "{status:?}");
    }
    // Never reached: nothing was created. Reached and timed out: unknown.
    assert_eq!(classify(&failure(None, false)), ErrorClass::Outage);
    let mut timed_out = failure(None, true);
    timed_out.timed_out = true;
    assert_eq!(classify(&timed_out), ErrorClass::Unknown);
}

#[test]
fn rate_limits_keep_retry_after() {
    let mut f = failure(Some(429), true);
    f.retry_after = Some(Duration::from_secs(7));
    let e = provider_error(f);
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
}

fn egress(host: &str, lock: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: "https://sb:tok@gw.example:8443".into(),
        gateway_host: host.into(),
        gateway_port: 8443,
        ca_pem: "PEM".into(),
        lock_down: lock,
    }
}

#[test]
fn policies() {
    let named = lockdown(&egress("gw.example", true)).unwrap();
    assert_eq!(named["allow_all"], false);
    assert_eq!(named["allowed_hostnames"], json!(["gw.example"]));
    assert!(named.get("allowed_cidrs").is_none());
    let ip = lockdown(&egress("192.0.2.7", true)).unwrap();
    assert_eq!(ip["allowed_hostnames"], json!([]));
    assert_eq!(
        ip["allowed_cidrs"],
        json!([{"cidr": "192.0.2.7/32", "ports": [{"port": 8443, "protocol": "TCP"}]}])
    );
    assert!(lockdown(&egress("gw.example", false)).is_none());
    assert!(policy_body(&egress("2001:db8::1", true)).is_err());
    assert!(lockdown(&egress("2001:db8::1", true)).is_none());
}

#[test]
fn options() {
    let key = || Secret::new("k".to_string());
    let opts = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    let a = RunloopAccount::from_options(None, &opts(&[]), key()).unwrap();
    assert_eq!(a.base_url, "https://api.runloop.ai");
    assert_eq!(a.boot_timeout, Duration::from_secs(300));
    let a = RunloopAccount::from_options(
        Some("http://127.0.0.1:1"),
        &opts(&[
            ("blueprint_name", "py"),
            ("resource_size", "small"),
            ("keep_alive_secs", "600"),
        ]),
        key(),
    )
    .unwrap();
    assert_eq!(a.resource_size.as_deref(), Some("SMALL"));
    assert_eq!(a.keep_alive_secs, Some(600));
    let (field, message) =
        RunloopAccount::from_options(None, &opts(&[("template", "x")]), key()).unwrap_err();
    assert_eq!(field, "options.template");
    assert!(message.contains("blueprint_name"), "{message}");
    let (field, _) =
        RunloopAccount::from_options(None, &opts(&[("resource_size", "HUGE")]), key()).unwrap_err();
    assert_eq!(field, "options.resource_size");
    let (field, _) = RunloopAccount::from_options(
        None,
        &opts(&[("blueprint_name", "a"), ("blueprint_id", "b")]),
        key(),
    )
    .unwrap_err();
    assert_eq!(field, "options.blueprint_name");
    let (field, _) =
        RunloopAccount::from_options(None, &opts(&[("keep_alive_secs", "0")]), key()).unwrap_err();
    assert_eq!(field, "options.keep_alive_secs");
}

#[test]
fn sse_events() {
    let buf = b"event: message\ndata: {\"output\":\"hi\"}\n\ndata: x".to_vec();
    let (event, rest) = split_event(&buf).unwrap();
    assert_eq!(
        parse_event(&event),
        (Some("message".into()), "{\"output\":\"hi\"}".into())
    );
    assert_eq!(rest, b"data: x");
    assert!(split_event(&rest).is_none());
    let crlf = b"data: a\r\n\r\n".to_vec();
    let (event, _) = split_event(&crlf).unwrap();
    assert_eq!(parse_event(&event).1, "a");
}
