//! The failure table, names, options, process bodies and NDJSON lines.

use super::exec::{parse_line, process_body, Line, ProcessViewLite};
use super::*;
use crate::ops::ExecSpec;
use crate::providers::hosted::errors::test_failure;

fn failure(status: Option<u16>, body: Value) -> HttpFailure {
    test_failure(status, body, true)
}

#[test]
fn the_failure_table() {
    let code = |c: &str| json!({"code": c, "message": "x", "status_code": 400});
    let edge = |c: &str| json!({"error": {"code": c, "message": "x", "status": 503}});
    let cases = [
        (403, code("QUOTA_EXCEEDED"), ErrorClass::Quota),
        (429, edge("USAGE_LIMIT_EXCEEDED"), ErrorClass::Quota),
        (429, code("RATE_LIMIT_EXCEEDED"), ErrorClass::RateLimit),
        (
            429,
            code("WORKSPACE_RATE_LIMIT_EXCEEDED"),
            ErrorClass::RateLimit,
        ),
        (403, code("UNAUTHORIZED"), ErrorClass::UnboundAccount),
        (401, edge("TOKEN_REVOKED"), ErrorClass::UnboundAccount),
        (503, code("AUTHENTICATION_UNAVAILABLE"), ErrorClass::Outage),
        (503, edge("WORKLOAD_UNAVAILABLE"), ErrorClass::Outage),
        (400, code("INVALID_IMAGE"), ErrorClass::Unsupported),
        (400, code("INVALID_REGION"), ErrorClass::RegionUnavailable),
        (400, code("VALIDATION_FAILED"), ErrorClass::InvalidRequest),
        (
            408,
            code("CREATION_TIMEOUT"),
            ErrorClass::FailedBeforeRunning,
        ),
        // The generic control-plane error: `code` is the status, a number.
        (
            409,
            json!({"error": "exists", "code": 409}),
            ErrorClass::ProviderError,
        ),
        (
            400,
            json!({"error": "bad", "code": 400}),
            ErrorClass::InvalidRequest,
        ),
        (401, json!({}), ErrorClass::UnboundAccount),
        (403, json!({}), ErrorClass::UnboundAccount),
        (404, json!({}), ErrorClass::Unsupported),
        (408, json!({}), ErrorClass::Unknown),
        (429, json!({}), ErrorClass::RateLimit),
        (500, json!({}), ErrorClass::ProviderError),
        (502, json!({}), ErrorClass::Outage),
        (503, json!({}), ErrorClass::Outage),
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
    // A quota refusal made nothing; a 5xx may have.
    assert!(
        !ERRORS
            .create_error(failure(Some(503), code("QUOTA_EXCEEDED")))
            .maybe_created
    );
    assert!(
        !ERRORS
            .create_error(failure(Some(503), code("AUTHENTICATION_UNAVAILABLE")))
            .maybe_created
    );
    assert!(
        ERRORS
            .create_error(failure(Some(503), json!({})))
            .maybe_created
    );
    let described = describe(&HttpFailure {
        message: "blaxel answered 503".into(),
        ..failure(Some(503), edge("WORKLOAD_UNAVAILABLE"))
    });
    assert_eq!(described, "blaxel answered 503 (WORKLOAD_UNAVAILABLE)");
    let odd = describe(&HttpFailure {
        message: "blaxel answered 400".into(),
        ..failure(Some(400), json!({"code": "key bl_123 is bad"}))
    });
    assert_eq!(odd, "blaxel answered 400", "only identifiers are repeated");
}

#[test]
fn rate_limits_keep_retry_after() {
    let mut f = failure(
        Some(429),
        json!({"code": "RATE_LIMIT_EXCEEDED", "message": "slow"}),
    );
    f.retry_after = Some(Duration::from_secs(7));
    let e = provider_error(f);
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
}

#[test]
fn sandbox_names_fit_blaxel() {
    let valid = |n: &str| {
        n.len() <= NAME_MAX
            && !n.contains("--")
            && !n.ends_with('-')
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let plain = "sb-0123456789abcdef01234567-a1";
    assert_eq!(sandbox_name(plain), format!("sg-{plain}"));
    for odd in [
        "SB_1/a2",
        "",
        "--",
        "x".repeat(80).as_str(),
        "sb-0123456789abcdef0123456789abcdef-a12",
    ] {
        let name = sandbox_name(odd);
        assert!(valid(&name), "{odd:?} -> {name:?}");
    }
    assert_ne!(
        sandbox_name("A-1"),
        sandbox_name("a-1"),
        "distinct ids, distinct names"
    );
    assert_ne!(sandbox_name("a_1"), sandbox_name("a.1"));
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
    let a = BlaxelAccount::from_options(None, &opts(&[("workspace", "team")]), key()).unwrap();
    assert_eq!(a.base_url, DEFAULT_BASE_URL);
    assert_eq!(a.image, DEFAULT_IMAGE);
    assert_eq!(a.memory_mb, 4096);
    assert_eq!(a.boot_timeout, Duration::from_secs(300));
    let a = BlaxelAccount::from_options(
        Some("http://127.0.0.1:1/v0"),
        &opts(&[
            ("workspace", "team"),
            ("image", "blaxel/py-app:latest"),
            ("memory_mb", "2048"),
            ("region", "us-pdx-1"),
        ]),
        key(),
    )
    .unwrap();
    assert_eq!(a.region.as_deref(), Some("us-pdx-1"));
    assert_eq!(a.memory_mb, 2048);
    let (field, _) = BlaxelAccount::from_options(None, &opts(&[]), key()).unwrap_err();
    assert_eq!(field, "options.workspace");
    let (field, message) =
        BlaxelAccount::from_options(None, &opts(&[("workspace", "t"), ("team", "x")]), key())
            .unwrap_err();
    assert_eq!(field, "options.team");
    assert!(message.contains("workspace"), "{message}");
    let (field, _) = BlaxelAccount::from_options(
        None,
        &opts(&[("workspace", "t"), ("memory_mb", "0")]),
        key(),
    )
    .unwrap_err();
    assert_eq!(field, "options.memory_mb");
}

#[test]
fn process_bodies() {
    let spec = ExecSpec {
        argv: vec!["sh".into(), "-c".into(), "echo $A; exit 2".into()],
        env: BTreeMap::from([("A".to_string(), "x y".to_string())]),
        cwd: Some("/home/user".into()),
        timeout: None,
        user: None,
    };
    let body = process_body(&spec, "sandgate-1").unwrap();
    assert_eq!(body["command"], "sh -c 'echo $A; exit 2'");
    assert_eq!(body["env"], json!({"A": "x y"}));
    assert_eq!(body["workingDir"], "/home/user");
    assert_eq!(body["waitForCompletion"], true);
    assert_eq!(body["name"], "sandgate-1");
    let bad = ExecSpec {
        argv: vec!["true".into()],
        env: BTreeMap::from([("A-B".to_string(), "x".to_string())]),
        ..ExecSpec::default()
    };
    assert_eq!(
        process_body(&bad, "n").unwrap_err().kind,
        OpErrorKind::Invalid
    );
    assert_eq!(
        process_body(&ExecSpec::default(), "n").unwrap_err().kind,
        OpErrorKind::Invalid
    );
}

#[test]
fn ndjson_lines() {
    assert_eq!(
        parse_line(r#"{"type":"stdout","data":"hi\n"}"#),
        Line::Stdout("hi\n".into())
    );
    assert_eq!(
        parse_line(r#"{"type":"stderr","data":"oops"}"#),
        Line::Stderr("oops".into())
    );
    let result =
        json!({"type": "result", "data": json!({"status": "failed", "exitCode": 3}).to_string()});
    assert_eq!(
        parse_line(&result.to_string()),
        Line::Result(ProcessViewLite {
            status: "failed".into(),
            exit_code: Some(3)
        })
    );
    assert_eq!(parse_line("[keepalive]"), Line::Other);
    assert_eq!(parse_line(r#"{"type":"ping"}"#), Line::Other);
}

#[test]
fn filesystem_paths_are_appended_as_the_sdk_does() {
    let path = |p: &str| filesystem_path(p).unwrap();
    assert_eq!(path("/tmp/a b.txt"), "/filesystem//tmp/a%20b.txt");
    assert_eq!(path("notes.txt"), "/filesystem/notes.txt");
    assert_eq!(path("/a/./b"), "/filesystem//a/b");
    assert_eq!(
        filesystem_path("/a/../b").unwrap_err().kind,
        OpErrorKind::Invalid
    );
}

#[test]
fn nothing_is_locked_down() {
    const { assert!(!LOCKS_DOWN) };
    assert_eq!(lockdown_refusal().class, ErrorClass::Unsupported);
}
