//! The failure table, options, the create body and the environment script.

use std::sync::Arc;

use super::*;
use crate::providers::RemoteEgress;

fn failure(status: Option<u16>, code: Option<&str>, sent: bool) -> HttpFailure {
    let body = match code {
        Some(code) => json!({"code": code, "message": "x"}),
        None => json!({"message": "x"}),
    };
    crate::providers::hosted::errors::test_failure(status, body, sent)
}

#[test]
fn freestyle_the_failure_table() {
    let cases = [
        (Some(403), Some("VM_LIMIT_EXCEEDED"), ErrorClass::Quota),
        (
            Some(403),
            Some("TOTAL_VM_LIMIT_EXCEEDED"),
            ErrorClass::Quota,
        ),
        (
            Some(403),
            Some("SNAPSHOT_LIMIT_EXCEEDED"),
            ErrorClass::Quota,
        ),
        (Some(429), None, ErrorClass::RateLimit),
        (Some(401), Some("UNAUTHORIZED"), ErrorClass::UnboundAccount),
        (Some(401), None, ErrorClass::UnboundAccount),
        (Some(403), Some("FORBIDDEN"), ErrorClass::UnboundAccount),
        (
            Some(403),
            Some("VM_ACCESS_DENIED"),
            ErrorClass::UnboundAccount,
        ),
        (Some(403), None, ErrorClass::UnboundAccount),
        (
            Some(403),
            Some("PERSISTENT_VMS_NOT_ALLOWED"),
            ErrorClass::Unsupported,
        ),
        (
            Some(404),
            Some("SNAPSHOT_NOT_FOUND"),
            ErrorClass::Unsupported,
        ),
        (
            Some(400),
            Some("INVALID_SNAPSHOT_ID"),
            ErrorClass::Unsupported,
        ),
        (
            Some(404),
            Some("NO_DEFAULT_SNAPSHOT_AVAILABLE"),
            ErrorClass::Unsupported,
        ),
        (Some(404), None, ErrorClass::Unsupported),
        (
            Some(400),
            Some("CREATE_VM_BAD_REQUEST"),
            ErrorClass::InvalidRequest,
        ),
        (Some(400), Some("BAD_REQUEST"), ErrorClass::InvalidRequest),
        (
            Some(400),
            Some("INVALID_REQUEST"),
            ErrorClass::InvalidRequest,
        ),
        (
            Some(400),
            Some("VALIDATION_ERROR"),
            ErrorClass::InvalidRequest,
        ),
        (Some(422), None, ErrorClass::InvalidRequest),
        (Some(504), Some("VM_START_TIMEOUT"), ErrorClass::Unknown),
        (Some(408), None, ErrorClass::Unknown),
        (Some(504), None, ErrorClass::Unknown),
        (Some(503), Some("UNAVAILABLE"), ErrorClass::Outage),
        (Some(503), Some("SERVICE_UNAVAILABLE"), ErrorClass::Outage),
        (Some(502), None, ErrorClass::Outage),
        (Some(503), None, ErrorClass::Outage),
        (
            Some(409),
            Some("VM_IS_SUSPENDING"),
            ErrorClass::ProviderError,
        ),
        (
            Some(500),
            Some("VM_SETUP_FAILED"),
            ErrorClass::ProviderError,
        ),
        (Some(500), Some("INTERNAL_ERROR"), ErrorClass::ProviderError),
        (Some(500), None, ErrorClass::ProviderError),
    ];
    for (status, code, class) in cases {
        assert_eq!(
            classify(&failure(status, code, true)),
            class,
            "{status:?} {code:?}"
        );
    }
    // The OpenAPI shape `{error, message}` is read too.
    let openapi = crate::providers::hosted::errors::test_failure(
        Some(403),
        json!({"error": "VM_LIMIT_EXCEEDED", "message": "x"}),
        true,
    );
    assert_eq!(classify(&openapi), ErrorClass::Quota);
    assert_eq!(classify(&failure(None, None, false)), ErrorClass::Outage);
    assert_eq!(classify(&failure(None, None, true)), ErrorClass::Unknown);
    // A refusal made nothing; a 5xx or no answer may have made the VM.
    assert!(
        !ERRORS
            .create_error(failure(Some(403), Some("VM_LIMIT_EXCEEDED"), true))
            .maybe_created
    );
    assert!(
        ERRORS
            .create_error(failure(Some(500), None, true))
            .maybe_created
    );
    assert!(ERRORS.create_error(failure(None, None, true)).maybe_created);
    assert_eq!(
        ERRORS
            .op_error(failure(Some(404), Some("VM_NOT_FOUND"), true))
            .kind,
        OpErrorKind::NotFound
    );
    assert_eq!(
        ERRORS
            .op_error(failure(Some(410), Some("VM_DELETED"), true))
            .kind,
        OpErrorKind::NotFound
    );
    assert_eq!(
        ERRORS
            .op_error(failure(Some(409), Some("VM_IS_SUSPENDING"), true))
            .kind,
        OpErrorKind::Conflict
    );
}

#[test]
fn freestyle_describe_names_the_code_only_when_it_is_one() {
    let mut f = failure(Some(403), Some("VM_LIMIT_EXCEEDED"), true);
    f.message = "freestyle answered 403 Forbidden: limit".into();
    assert_eq!(
        describe(&f),
        "freestyle answered 403 Forbidden: limit (VM_LIMIT_EXCEEDED)"
    );
    let f = failure(Some(403), Some("not a code <script>"), true);
    assert_eq!(describe(&f), f.message);
}

#[test]
fn freestyle_rate_limits_keep_retry_after() {
    let mut f = failure(Some(429), None, true);
    f.retry_after = Some(Duration::from_secs(7));
    let e = provider_error(f);
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
}

fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn freestyle_options() {
    let key = || Secret::new("k".to_string());
    let a = FreestyleAccount::from_options(None, &opts(&[]), key()).unwrap();
    assert_eq!(a.base_url, DEFAULT_BASE_URL);
    assert_eq!(a.persistence, "sticky");
    assert_eq!(a.boot_timeout, Duration::from_secs(300));
    let a = FreestyleAccount::from_options(
        Some("http://127.0.0.1:1"),
        &opts(&[
            ("snapshot_id", "sc-abc"),
            ("persistence", "Persistent"),
            ("idle_timeout_secs", "600"),
        ]),
        key(),
    )
    .unwrap();
    assert_eq!(a.snapshot_id.as_deref(), Some("sc-abc"));
    assert_eq!(a.persistence, "persistent");
    assert_eq!(a.idle_timeout_secs, Some(600));
    for (bad, field) in [
        (("template", "x"), "options.template"),
        (("persistence", "forever"), "options.persistence"),
        (("snapshot_id", " "), "options.snapshot_id"),
        (("idle_timeout_secs", "0"), "options.idle_timeout_secs"),
        (("boot_timeout_secs", "soon"), "options.boot_timeout_secs"),
    ] {
        let (f, _) = FreestyleAccount::from_options(None, &opts(&[bad]), key()).unwrap_err();
        assert_eq!(f, field);
    }
}

fn adapter(options: &[(&str, &str)]) -> Freestyle {
    let account = FreestyleAccount::from_options(
        Some("http://127.0.0.1:1"),
        &opts(options),
        Secret::new("k".to_string()),
    )
    .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = crate::tls::upstream_client_config(&[]).unwrap();
    Freestyle::new(account, tls).unwrap()
}

fn spec(source: Option<Source>, egress: bool) -> CreateSpec {
    let request = sandgate_router::Request {
        source,
        ..Default::default()
    };
    CreateSpec {
        tags: Tags {
            sandbox_id: "sb-1".into(),
            attempt_id: "sb-1-a1".into(),
        },
        pool: "fs".into(),
        account: "fs".into(),
        request: Arc::new(request),
        env: BTreeMap::from([("SANDGATE_CRED_GH".to_string(), "placeholder".to_string())]),
        snapshot: None,
        egress: egress.then(|| RemoteEgress {
            proxy_url: "https://sb-1:tok@gw.example:3128".into(),
            gateway_host: "gw.example".into(),
            gateway_port: 3128,
            ca_pem: "PEM".into(),
            lock_down: false,
        }),
    }
}

#[test]
fn freestyle_create_body_carries_tags_env_ca_and_source() {
    let fs = adapter(&[("snapshot_id", "sc-default"), ("idle_timeout_secs", "900")]);
    let body = fs.create_body(&spec(None, true));
    let files = &body["additionalFiles"];
    let tags: Value = serde_json::from_str(files[TAGS_PATH]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        tags,
        json!({"sandgate_sandbox": "sb-1", "sandgate_attempt": "sb-1-a1"})
    );
    let env = files[ENV_PATH]["content"].as_str().unwrap();
    assert!(
        env.contains("export SANDGATE_CRED_GH=placeholder\n"),
        "{env}"
    );
    assert!(
        env.contains("export HTTPS_PROXY=https://sb-1:tok@gw.example:3128\n"),
        "{env}"
    );
    assert!(
        env.contains(&format!("export SSL_CERT_FILE={CA_PATH}\n")),
        "{env}"
    );
    assert_eq!(files[CA_PATH]["content"], "PEM");
    assert_eq!(body["persistence"], json!({"type": "sticky"}));
    assert_eq!(body["ports"], json!([]));
    assert_eq!(body["idleTimeoutSeconds"], 900);
    assert_eq!(body["snapshotId"], "sc-default");
    // No egress: no CA; a template wins over the account's snapshot, a snapshot over both.
    let mut s = spec(Some(Source::Template("sc-tpl".into())), false);
    assert_eq!(fs.create_body(&s)["snapshotId"], "sc-tpl");
    assert!(fs.create_body(&s)["additionalFiles"].get(CA_PATH).is_none());
    s.snapshot = Some("sc-snap".into());
    assert_eq!(fs.create_body(&s)["snapshotId"], "sc-snap");
    let plain = adapter(&[]).create_body(&spec(None, false));
    assert!(plain.get("snapshotId").is_none());
    assert!(plain.get("idleTimeoutSeconds").is_none());
}

#[test]
fn freestyle_env_script_quotes_and_skips_bad_names() {
    let env = BTreeMap::from([
        ("A".to_string(), "it's $HOME".to_string()),
        ("BAD-NAME".to_string(), "x".to_string()),
    ]);
    let script = env_script(&env);
    assert!(script.contains("export A='it'\\''s $HOME'\n"), "{script}");
    assert!(!script.contains("BAD-NAME"));
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{script}\nprintf %s \"$A\""))
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"it's $HOME");
}

#[test]
fn freestyle_file_answers_are_read_as_the_sdk_reads_them() {
    let file: wire::FileView =
        serde_json::from_value(json!({"content": "AAH/", "encoding": "base64"})).unwrap();
    assert_eq!(file.bytes().unwrap(), [0, 1, 255]);
    assert!(file.entries().is_none());
    let text: wire::FileView = serde_json::from_value(json!({"content": "héllo"})).unwrap();
    assert_eq!(text.bytes().unwrap(), "héllo".as_bytes());
    let dir: wire::FileView = serde_json::from_value(
        json!({"files": [{"name": "a", "kind": "file"}, {"name": "d", "kind": "directory"}]}),
    )
    .unwrap();
    let entries = dir.entries().unwrap();
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind))
            .collect::<Vec<_>>(),
        [("a", "file"), ("d", "dir")]
    );
    assert_eq!(dir.bytes().unwrap_err().kind, OpErrorKind::Invalid);
    let broken: wire::FileView =
        serde_json::from_value(json!({"content": "not base64!", "encoding": "base64"})).unwrap();
    assert_eq!(broken.bytes().unwrap_err().kind, OpErrorKind::Provider);
    // Every state but `starting` is a VM that exists and can run again.
    for (state, live) in [
        ("starting", false),
        ("running", true),
        ("suspended", true),
        ("stopped", true),
    ] {
        let vm: wire::VmView = serde_json::from_value(json!({"id": "v", "state": state})).unwrap();
        assert_eq!(
            vm.instance_state() == crate::providers::InstanceState::Running,
            live,
            "{state}"
        );
    }
}
