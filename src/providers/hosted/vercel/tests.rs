//! The failure table, options, the lock-down, tar names, NDJSON lines and states.

use super::exec::{parse_line, Line};
use super::wire::*;
use super::*;
use crate::ops::ExecEvent;
use crate::providers::hosted::errors::test_failure as failure;
use crate::providers::InstanceState;

fn err(code: &str) -> Value {
    json!({"error": {"code": code, "message": "m"}})
}

#[test]
fn the_failure_table() {
    let cases = [
        (400, err("bad_request"), ErrorClass::InvalidRequest),
        (422, err("sandbox_stopping"), ErrorClass::InvalidRequest),
        (401, err("forbidden"), ErrorClass::UnboundAccount),
        (403, err("forbidden"), ErrorClass::UnboundAccount),
        (402, err("payment_required"), ErrorClass::Billing),
        (404, err("not_found"), ErrorClass::Unsupported),
        (410, err("snapshot_not_found"), ErrorClass::Unsupported),
        (410, err("sandbox_stopped"), ErrorClass::ProviderError),
        (409, err("conflict"), ErrorClass::ProviderError),
        (429, err("rate_limited"), ErrorClass::RateLimit),
        (500, json!({}), ErrorClass::Outage),
        (502, json!({}), ErrorClass::Outage),
        (503, json!({}), ErrorClass::Outage),
        (504, json!({}), ErrorClass::Unknown),
    ];
    for (status, body, class) in cases {
        assert_eq!(
            classify(&failure(Some(status), body.clone(), true)),
            class,
            "{status} {body}"
        );
    }
    assert_eq!(
        classify(&failure(None, json!(null), false)),
        ErrorClass::Outage
    );
    assert_eq!(
        classify(&failure(None, json!(null), true)),
        ErrorClass::Unknown
    );
    let mut limited = failure(Some(429), err("rate_limited"), true);
    limited.retry_after = Some(Duration::from_secs(7));
    assert_eq!(
        provider_error(limited).retry_after,
        Some(Duration::from_secs(7))
    );
}

#[test]
fn options_are_checked() {
    let key = || Secret::new("k".to_string());
    let opts = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    let a = VercelAccount::from_options(
        None,
        &opts(&[("team_id", "team_1"), ("project_id", "prj_1")]),
        key(),
    )
    .unwrap();
    assert_eq!(a.base_url, DEFAULT_BASE_URL);
    assert_eq!(a.base, BaseImage::Default);
    assert_eq!(a.timeout_ms, DEFAULT_TIMEOUT_MS);
    let e = VercelAccount::from_options(None, &opts(&[("project_id", "p")]), key()).unwrap_err();
    assert_eq!(e.0, "options.team_id");
    let e = VercelAccount::from_options(None, &opts(&[("team_id", "t")]), key()).unwrap_err();
    assert_eq!(e.0, "options.project_id");
    let e = VercelAccount::from_options(
        None,
        &opts(&[("team_id", "t"), ("project_id", "p"), ("region", "x")]),
        key(),
    )
    .unwrap_err();
    assert_eq!(e.0, "options.region");
    assert!(e
        .1
        .contains("team_id, project_id, runtime, image, vcpus, timeout_ms"));
    let e = VercelAccount::from_options(
        None,
        &opts(&[
            ("team_id", "t"),
            ("project_id", "p"),
            ("runtime", "node22"),
            ("image", "i"),
        ]),
        key(),
    )
    .unwrap_err();
    assert_eq!(e.0, "options.image");
    for (name, bad) in [("vcpus", "0"), ("vcpus", "x"), ("timeout_ms", "0")] {
        let e = VercelAccount::from_options(
            None,
            &opts(&[("team_id", "t"), ("project_id", "p"), (name, bad)]),
            key(),
        )
        .unwrap_err();
        assert_eq!(e.0, format!("options.{name}"));
    }
    let a = VercelAccount::from_options(
        Some("http://127.0.0.1:9"),
        &opts(&[
            ("team_id", "t"),
            ("project_id", "p"),
            ("runtime", "node22"),
            ("vcpus", "4"),
        ]),
        key(),
    )
    .unwrap();
    assert_eq!(a.base, BaseImage::Runtime("node22".into()));
    assert_eq!(a.vcpus, Some(4));
    assert_eq!(a.base_url, "http://127.0.0.1:9");
}

fn egress(host: &str, lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: format!("https://sb:tok@{host}:8443"),
        gateway_host: host.into(),
        gateway_port: 8443,
        ca_pem: "PEM".into(),
        lock_down,
    }
}

#[test]
fn lockdown_names_only_the_gateway() {
    assert_eq!(
        lockdown(&egress("203.0.113.7", true)),
        Some(json!({"allow": [], "subnets": {"allow": ["203.0.113.7/32"]}}))
    );
    assert_eq!(
        lockdown(&egress("2001:db8::1", true)),
        Some(json!({"allow": [], "subnets": {"allow": ["2001:db8::1/128"]}}))
    );
    assert_eq!(
        lockdown(&egress("gw.example.com", true)),
        Some(json!({"allow": ["gw.example.com"]}))
    );
    assert_eq!(lockdown(&egress("gw.example.com", false)), None);
}

#[test]
fn tar_names_are_normalized() {
    assert_eq!(
        tar_name("/vercel/sandbox/a.txt").unwrap(),
        "vercel/sandbox/a.txt"
    );
    assert_eq!(tar_name("b/../c.txt").unwrap(), "vercel/sandbox/c.txt");
    assert_eq!(tar_name("/../../etc/x").unwrap(), "etc/x");
    assert!(tar_name("/").is_err());
    let gz = tar_gz(CA_PATH, b"PEM").unwrap();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
    let mut entries = archive.entries().unwrap();
    let mut entry = entries.next().unwrap().unwrap();
    assert_eq!(
        entry.path().unwrap().to_str().unwrap(),
        "vercel/sandbox/.sandgate/ca.pem"
    );
    let mut data = String::new();
    std::io::Read::read_to_string(&mut entry, &mut data).unwrap();
    assert_eq!(data, "PEM");
}

#[test]
fn ndjson_lines() {
    let mut seen = false;
    let first = br#"{"command":{"id":"cmd_1","exitCode":null}}"#;
    assert!(matches!(parse_line(first, &mut seen), Line::Command(id) if id == "cmd_1"));
    assert!(matches!(
        parse_line(br#"{"stream":"stdout","data":"hi"}"#, &mut seen),
        Line::Output(ExecEvent::Stdout(b)) if &b[..] == b"hi"
    ));
    assert!(matches!(
        parse_line(
            br#"{"stream":"error","data":{"code":"x","message":"y"}}"#,
            &mut seen
        ),
        Line::Error
    ));
    assert!(matches!(
        parse_line(br#"{"command":{"id":"cmd_1","exitCode":3}}"#, &mut seen),
        Line::Finished(3)
    ));
}

#[test]
fn sandbox_states() {
    assert_eq!(state_of("pending"), InstanceState::Starting);
    assert_eq!(state_of("running"), InstanceState::Running);
    assert_eq!(state_of("stopped"), InstanceState::Failed);
    assert_eq!(state_of("failed"), InstanceState::Failed);
}
