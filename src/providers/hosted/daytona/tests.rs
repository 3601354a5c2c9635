//! The failure table, the lock-down, options, quoting and Daytona's JSON.

use super::wire::*;
use super::*;
use crate::ops::SandboxEntry;
use crate::providers::hosted::errors::test_failure as failure;

/// Daytona's error body: `{path, timestamp, statusCode, error, message}`.
fn said(status: u16, message: &str) -> Value {
    json!({"statusCode": status, "error": "x", "message": message, "path": "/api/sandbox"})
}

#[test]
fn the_failure_table() {
    let cases = [
        (
            Some(400),
            said(400, "No available runners"),
            ErrorClass::Capacity,
        ),
        (
            Some(503),
            said(503, "Region is at capacity"),
            ErrorClass::Capacity,
        ),
        (
            Some(400),
            said(
                400,
                "Total CPU limit exceeded. Maximum allowed: 10.\nUpgrade your tier",
            ),
            ErrorClass::Quota,
        ),
        (
            Some(400),
            said(
                400,
                "CPU request 8 exceeds maximum allowed per sandbox (4).",
            ),
            ErrorClass::Quota,
        ),
        (
            Some(403),
            said(403, "Organization is suspended: unpaid"),
            ErrorClass::Billing,
        ),
        (
            Some(403),
            said(
                403,
                "Region eu is not available to the organization for class container",
            ),
            ErrorClass::RegionUnavailable,
        ),
        (
            Some(404),
            said(404, "Region not found"),
            ErrorClass::RegionUnavailable,
        ),
        (
            Some(400),
            said(
                400,
                "Snapshot py-3.12 not found. Did you add it through the Daytona Dashboard?",
            ),
            ErrorClass::Unsupported,
        ),
        (
            Some(400),
            said(400, "Invalid IP address: \"x\""),
            ErrorClass::InvalidRequest,
        ),
        (
            Some(422),
            said(422, "Forking is not supported"),
            ErrorClass::InvalidRequest,
        ),
        (
            Some(401),
            said(401, "Unauthorized"),
            ErrorClass::UnboundAccount,
        ),
        (
            Some(403),
            said(403, "Forbidden resource"),
            ErrorClass::UnboundAccount,
        ),
        (
            Some(404),
            said(404, "Sandbox with ID or name x not found"),
            ErrorClass::Unsupported,
        ),
        (Some(408), json!({}), ErrorClass::Unknown),
        (
            Some(409),
            said(409, "Sandbox state change in progress"),
            ErrorClass::ProviderError,
        ),
        (
            Some(429),
            said(429, "ThrottlerException: Too Many Requests"),
            ErrorClass::RateLimit,
        ),
        // 429 wins over a message that reads like a quota.
        (
            Some(429),
            said(429, "Rate limit exceeded"),
            ErrorClass::RateLimit,
        ),
        (
            Some(500),
            said(500, "An unexpected error occurred."),
            ErrorClass::ProviderError,
        ),
        (Some(502), json!({}), ErrorClass::Outage),
        (
            Some(503),
            said(503, "Service Unavailable"),
            ErrorClass::Outage,
        ),
        (Some(504), json!({}), ErrorClass::Unknown),
    ];
    for (status, body, class) in cases {
        assert_eq!(
            classify(&failure(status, body.clone(), true)),
            class,
            "{status:?} {body}"
        );
    }
    // Never sent: nothing exists. Sent and then lost: reconcile.
    assert_eq!(
        classify(&failure(None, json!(null), false)),
        ErrorClass::Outage
    );
    assert_eq!(
        classify(&failure(None, json!(null), true)),
        ErrorClass::Unknown
    );
    let mut timed_out = failure(None, json!(null), true);
    timed_out.timed_out = true;
    assert_eq!(classify(&timed_out), ErrorClass::Unknown);
    // Classes and what the coordinator does with them.
    assert!(ErrorClass::RateLimit.retryable());
    assert_eq!(
        ErrorClass::UnboundAccount.outcome(),
        crate::providers::Outcome::Advance
    );
    assert_eq!(
        ErrorClass::InvalidRequest.outcome(),
        crate::providers::Outcome::Terminal
    );
    assert_eq!(
        ErrorClass::Unknown.outcome(),
        crate::providers::Outcome::Unknown
    );
}

#[test]
fn retry_after_travels_with_the_error() {
    let mut f = failure(Some(429), said(429, "Too Many Requests"), true);
    f.retry_after = Some(Duration::from_secs(7));
    let e = provider_error(f);
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
}

#[test]
fn error_reasons_keep_capacity_and_quota() {
    assert_eq!(reason_class("No available runners"), ErrorClass::Capacity);
    assert_eq!(reason_class("Total disk limit exceeded"), ErrorClass::Quota);
    assert_eq!(
        reason_class("Failed to pull image"),
        ErrorClass::FailedBeforeRunning
    );
    assert_eq!(reason_class(""), ErrorClass::FailedBeforeRunning);
    // An errorReason never ends the whole create.
    assert_eq!(
        reason_class("Unauthorized"),
        ErrorClass::FailedBeforeRunning
    );
}

#[test]
fn quoting_for_a_posix_shell() {
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(quote_argv(&argv(&["echo", "hello"])), "echo hello");
    assert_eq!(quote_argv(&argv(&["echo", ""])), "echo ''");
    assert_eq!(quote_argv(&argv(&["echo", "a b"])), "echo 'a b'");
    assert_eq!(quote_argv(&argv(&["echo", "it's"])), r"echo 'it'\''s'");
    assert_eq!(
        quote_argv(&argv(&["sh", "-c", "echo $HOME; `id` | cat > /x & *"])),
        "sh -c 'echo $HOME; `id` | cat > /x & *'"
    );
    assert_eq!(
        quote_argv(&argv(&["a\nb", "--k=v", "/p/x.y"])),
        "'a\nb' --k=v /p/x.y"
    );
    // A real shell reads back exactly the arguments.
    let hostile = [
        "'", "''", "a'b'c", "$(id)", "\\", "\"", "x\ny", " ", "!", "#", "~", "-",
    ];
    let script = format!("printf '%s\\0' {}", quote_argv(&argv(&hostile)));
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let got: Vec<String> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8(p.to_vec()).unwrap())
        .collect();
    assert_eq!(got, hostile);
}

#[test]
fn the_lock_down_needs_an_ipv4_gateway() {
    assert_eq!(gateway_cidr("203.0.113.7").unwrap(), "203.0.113.7/32");
    for host in ["gateway.example.com", "2001:db8::1", "", "203.0.113.7:3128"] {
        let e = gateway_cidr(host).unwrap_err();
        assert_eq!(e.class, ErrorClass::Unsupported, "{host}");
        assert!(!e.class.retryable());
        assert!(e.message.contains("IPv4"), "{}", e.message);
    }
    let egress = |host: &str, lock_down: bool| RemoteEgress {
        proxy_url: format!("https://sb:tok@{host}:3128"),
        gateway_host: host.to_string(),
        gateway_port: 3128,
        ca_pem: String::new(),
        lock_down,
    };
    assert_eq!(
        lockdown(&egress("203.0.113.7", true)),
        Some(json!({"networkBlockAll": false, "networkAllowList": "203.0.113.7/32"}))
    );
    assert_eq!(lockdown(&egress("203.0.113.7", false)), None);
    assert_eq!(lockdown(&egress("gw.example.com", true)), None);
    assert!(same_allow_list(Some("203.0.113.7/32"), "203.0.113.7/32"));
    assert!(same_allow_list(Some(" 203.0.113.7/32 "), "203.0.113.7/32"));
    assert!(!same_allow_list(None, "203.0.113.7/32"));
    assert!(!same_allow_list(Some("0.0.0.0/0"), "203.0.113.7/32"));
    assert!(!same_allow_list(
        Some("203.0.113.7/32,0.0.0.0/0"),
        "203.0.113.7/32"
    ));
}

#[test]
fn path_segments() {
    assert_eq!(path_segment("0f3e-4b2a_x.y~z"), "0f3e-4b2a_x.y~z");
    assert_eq!(path_segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
    assert_eq!(path_segment(".."), "%2E%2E");
}

#[test]
fn options_are_checked() {
    let opts = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    let a = DaytonaAccount::from_options(None, &opts(&[]), Secret::new("k")).unwrap();
    assert_eq!(a.base_url, "https://app.daytona.io/api");
    assert_eq!(a.create_timeout, Duration::from_secs(180));
    assert_eq!(a.request_timeout, Duration::from_secs(60));
    assert!(a.organization_id.is_none() && a.snapshot.is_none() && a.target.is_none());
    let a = DaytonaAccount::from_options(
        Some("http://127.0.0.1:9/api/"),
        &opts(&[
            ("organization_id", "org-1"),
            ("snapshot", "py"),
            ("target", "eu"),
            ("auto_stop_minutes", "0"),
            ("create_timeout_secs", "30"),
            ("request_timeout_secs", "2"),
        ]),
        Secret::new("k"),
    )
    .unwrap();
    assert_eq!(a.base_url, "http://127.0.0.1:9/api");
    assert_eq!(a.organization_id.as_deref(), Some("org-1"));
    assert_eq!(a.auto_stop_minutes, Some(0));
    assert_eq!(a.create_timeout, Duration::from_secs(30));
    assert_eq!(a.request_timeout, Duration::from_secs(2));
    for (pairs, field) in [
        (opts(&[("region", "eu")]), "options.region"),
        (
            opts(&[("auto_stop_minutes", "-1")]),
            "options.auto_stop_minutes",
        ),
        (
            opts(&[("create_timeout_secs", "0")]),
            "options.create_timeout_secs",
        ),
        (
            opts(&[("request_timeout_secs", "soon")]),
            "options.request_timeout_secs",
        ),
        (opts(&[("target", " ")]), "options.target"),
    ] {
        let (got, _) = DaytonaAccount::from_options(None, &pairs, Secret::new("k")).unwrap_err();
        assert_eq!(got, field);
    }
    let (field, _) =
        DaytonaAccount::from_options(Some("ftp://x"), &opts(&[]), Secret::new("k")).unwrap_err();
    assert_eq!(field, "base_url");
}

#[test]
fn listings_old_and_new() {
    let page: ListAnswer = serde_json::from_value(json!({
        "items": [{"id": "a", "state": "started", "labels": {"sandgate_sandbox": "s"}}],
        "nextCursor": "c2",
    }))
    .unwrap();
    assert!(
        matches!(page, ListAnswer::Page { ref items, next_cursor: Some(ref c) } if items.len() == 1 && c == "c2")
    );
    let last: ListAnswer =
        serde_json::from_value(json!({"items": [], "nextCursor": null})).unwrap();
    assert!(matches!(
        last,
        ListAnswer::Page {
            next_cursor: None,
            ..
        }
    ));
    let bare: ListAnswer = serde_json::from_value(json!([{"id": "a"}, {"id": "b"}])).unwrap();
    assert!(matches!(bare, ListAnswer::Bare(ref v) if v.len() == 2));
    let dto: SandboxDto = serde_json::from_value(json!({
        "id": "a", "state": "stopped",
        "labels": {"sandgate_sandbox": "s", "sandgate_attempt": "s-a1"},
    }))
    .unwrap();
    let i = dto.instance();
    assert_eq!(
        (i.tags.sandbox_id.as_str(), i.tags.attempt_id.as_str()),
        ("s", "s-a1")
    );
    assert_eq!(i.state, InstanceState::Running);
    for (state, expected) in [
        ("creating", InstanceState::Starting),
        ("pulling_snapshot", InstanceState::Starting),
        ("started", InstanceState::Running),
        ("paused", InstanceState::Running),
        ("error", InstanceState::Failed),
        ("build_failed", InstanceState::Failed),
    ] {
        let dto: SandboxDto = serde_json::from_value(json!({"id": "a", "state": state})).unwrap();
        assert_eq!(dto.instance().state, expected, "{state}");
    }
}

#[test]
fn file_entries_and_times() {
    let entry = SandboxEntry::from(FileInfoDto {
        name: "d".into(),
        size: 4096,
        is_dir: true,
        mode: "drwxr-xr-x".into(),
        permissions: "0755".into(),
        modified_at: Some("2026-06-25T13:16:13.123456789+02:00".into()),
    });
    assert_eq!((entry.kind, entry.mode), ("dir", 0o755));
    assert_eq!(entry.modified_unix, 1_782_386_173);
    assert_eq!(rfc3339_unix("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(rfc3339_unix("2000-03-01T00:00:00Z"), Some(951_868_800));
    assert_eq!(
        rfc3339_unix("2000-03-01T01:00:00-01:00"),
        Some(951_868_800 + 7200)
    );
    assert_eq!(rfc3339_unix("nonsense"), None);
}

#[test]
fn provisioned_resources_are_compared() {
    let dto: SandboxDto =
        serde_json::from_value(json!({"id": "a", "cpu": 1, "memory": 1, "disk": 3})).unwrap();
    let want = Resources {
        cpu: Some(2.0),
        memory_mb: Some(2048),
        disk_gb: Some(3),
        ..Resources::default()
    };
    assert_eq!(resource_shortfall(&want, &dto).len(), 2);
    let fits = Resources {
        cpu: Some(1.0),
        memory_mb: Some(512),
        ..Resources::default()
    };
    assert!(resource_shortfall(&fits, &dto).is_empty());
}
