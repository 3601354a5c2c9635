//! The failure table, names, the lock-down, options, file paths and the SSE reading.

use super::exec::{event_of, exec_body, split_event};
use super::wire::StreamEvent;
use super::*;
use crate::ops::ExecSpec;

fn failure(status: Option<u16>, code: Option<&str>, sent: bool) -> HttpFailure {
    let body = match code {
        Some(code) => json!({"error": {"code": code, "message": "x"}}),
        None => json!({"message": "x"}),
    };
    crate::providers::hosted::errors::test_failure(status, body, sent)
}

#[test]
fn the_failure_table() {
    let cases = [
        (Some(503), Some("capacity"), ErrorClass::Capacity),
        (Some(429), Some("rate_limited"), ErrorClass::RateLimit),
        (Some(409), Some("conflict"), ErrorClass::ProviderError),
        (
            Some(400),
            Some("invalid_request"),
            ErrorClass::InvalidRequest,
        ),
        (Some(401), Some("unauthorized"), ErrorClass::UnboundAccount),
        (Some(500), Some("internal"), ErrorClass::ProviderError),
        (Some(403), None, ErrorClass::UnboundAccount),
        (Some(404), None, ErrorClass::Unsupported),
        (Some(429), None, ErrorClass::RateLimit),
        (Some(502), None, ErrorClass::Outage),
        (Some(503), None, ErrorClass::Outage),
        (Some(504), None, ErrorClass::Unknown),
        (Some(500), None, ErrorClass::ProviderError),
    ];
    for (status, code, class) in cases {
        assert_eq!(
            classify(&failure(status, code, true)),
            class,
            "{status:?} {code:?}"
        );
    }
    assert_eq!(classify(&failure(None, None, false)), ErrorClass::Outage);
    let mut timed_out = failure(None, None, true);
    timed_out.timed_out = true;
    assert_eq!(classify(&timed_out), ErrorClass::Unknown);
    // A capacity refusal proves nothing runs; an internal error may have made the sandbox.
    assert!(
        !ERRORS
            .create_error(failure(Some(503), Some("capacity"), true))
            .maybe_created
    );
    assert!(
        ERRORS
            .create_error(failure(Some(500), Some("internal"), true))
            .maybe_created
    );
    let mut limited = failure(Some(429), Some("rate_limited"), true);
    limited.retry_after = Some(Duration::from_secs(7));
    assert_eq!(
        provider_error(limited).retry_after,
        Some(Duration::from_secs(7))
    );
}

#[test]
fn names_fit_a_durable_object() {
    assert_eq!(sandbox_name("sb-1-a1"), "sg-sb-1-a1");
    let odd = sandbox_name("Att_01H/x");
    assert!(odd.starts_with("sg-") && odd.len() == 43, "{odd}");
    assert_ne!(odd, sandbox_name("att_01h/x"));
    assert_eq!(sandbox_name(&"a".repeat(61)).len(), 43);
    for name in [odd, sandbox_name("")] {
        assert!(name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    }
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
fn the_lockdown() {
    assert_eq!(
        lockdown(&egress("GW.example", true)).unwrap(),
        json!({"enableInternet": false, "allowedHosts": ["gw.example"]})
    );
    assert_eq!(
        lockdown(&egress("192.0.2.7", true)).unwrap()["allowedHosts"],
        json!(["192.0.2.7"])
    );
    assert_eq!(
        lockdown(&egress("[2001:db8::1]", true)).unwrap()["allowedHosts"],
        json!(["[2001:db8::1]"])
    );
    assert!(lockdown(&egress("gw.example", false)).is_none());
    assert_eq!(
        outbound(Some(&egress("gw.example", false))),
        json!({"enableInternet": true, "allowedHosts": []})
    );
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
    let (field, _) = CloudflareAccount::from_options(None, &opts(&[]), key()).unwrap_err();
    assert_eq!(field, "base_url");
    let a = CloudflareAccount::from_options(
        Some("https://bridge.example.workers.dev"),
        &opts(&[("sleep_after_secs", "600")]),
        key(),
    )
    .unwrap();
    assert_eq!(a.sleep_after_secs, Some(600));
    assert_eq!(a.create_timeout, Duration::from_secs(180));
    let (field, _) =
        CloudflareAccount::from_options(Some("http://x"), &opts(&[("image", "x")]), key())
            .unwrap_err();
    assert_eq!(field, "options.image");
    let (field, _) = CloudflareAccount::from_options(
        Some("http://x"),
        &opts(&[("sleep_after_secs", "0")]),
        key(),
    )
    .unwrap_err();
    assert_eq!(field, "options.sleep_after_secs");
}

#[test]
fn file_paths() {
    assert_eq!(
        file_path("sg-1", "/home/user/a b.txt").unwrap(),
        "/v1/sandbox/sg-1/file/home/user/a%20b.txt"
    );
    assert_eq!(
        file_path("sg-1", "relative.txt").unwrap_err().kind,
        OpErrorKind::Invalid
    );
    assert_eq!(
        file_path("sg-1", "/etc/../x").unwrap_err().kind,
        OpErrorKind::Invalid
    );
    assert_eq!(
        file_path("sg-1", "/").unwrap_err().kind,
        OpErrorKind::Invalid
    );
}

#[test]
fn exec_bodies() {
    let spec = ExecSpec {
        argv: vec!["sh".into(), "-c".into(), "echo $A".into()],
        env: BTreeMap::from([("A".to_string(), "x y".to_string())]),
        cwd: Some("/tmp".into()),
        timeout: Some(Duration::from_secs(2)),
        user: None,
    };
    assert_eq!(
        exec_body(&spec).unwrap(),
        json!({"command": "exec sh -c 'echo $A'", "env": {"A": "x y"}, "cwd": "/tmp", "timeoutMs": 2000})
    );
    let bad = ExecSpec {
        argv: vec!["true".into()],
        env: BTreeMap::from([("A-B".to_string(), "x".to_string())]),
        ..ExecSpec::default()
    };
    assert_eq!(exec_body(&bad).unwrap_err().kind, OpErrorKind::Invalid);
}

#[test]
fn sse_events() {
    let buf =
        b"event: stdout\ndata: {\"type\":\"stdout\",\"data\":\"hi\"}\n\nevent: exit\r\n".to_vec();
    let (text, rest) = split_event(&buf).unwrap();
    assert_eq!(
        event_of(&text),
        Some(StreamEvent::Stdout { data: "hi".into() })
    );
    assert!(split_event(&rest).is_none());
    let exit = "event: exit\r\ndata: {\"type\":\"exit\",\"exitCode\":3}\r";
    assert_eq!(event_of(exit), Some(StreamEvent::Exit { exit_code: 3 }));
    assert_eq!(event_of("event: ping"), None);
    assert_eq!(event_of("data: {\"type\":\"other\"}"), None);
}
