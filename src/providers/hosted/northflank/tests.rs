//! The failure table, names, tags in the description, options and the create body.

use std::sync::Arc;

use super::*;
use crate::providers::hosted::errors::test_failure;
use crate::providers::RemoteEgress;

fn failure(status: Option<u16>) -> HttpFailure {
    let body = json!({"error": {"status": status, "message": "x", "id": "opaque"}});
    test_failure(status, body, true)
}

#[test]
fn the_failure_table() {
    let cases = [
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (402, ErrorClass::Billing),
        (403, ErrorClass::UnboundAccount),
        (404, ErrorClass::Unsupported),
        (408, ErrorClass::Unknown),
        (409, ErrorClass::ProviderError),
        (429, ErrorClass::RateLimit),
        (500, ErrorClass::ProviderError),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Outage),
        (504, ErrorClass::Unknown),
    ];
    for (status, class) in cases {
        assert_eq!(classify(&failure(Some(status))), class, "{status}");
    }
    assert_eq!(
        classify(&test_failure(None, json!(null), false)),
        ErrorClass::Outage
    );
    assert_eq!(
        classify(&test_failure(None, json!(null), true)),
        ErrorClass::Unknown
    );
    // A refusal made nothing; a 5xx or no answer may have.
    assert!(!ERRORS.create_error(failure(Some(429))).maybe_created);
    assert!(!ERRORS.create_error(failure(Some(402))).maybe_created);
    assert!(ERRORS.create_error(failure(Some(503))).maybe_created);
    assert!(ERRORS.create_error(failure(None)).maybe_created);
}

#[test]
fn rate_limits_keep_retry_after() {
    let mut f = failure(Some(429));
    f.retry_after = Some(Duration::from_secs(7));
    let e = provider_error(f);
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
}

fn valid(name: &str) -> bool {
    name.len() <= NAME_MAX
        && name.starts_with("sg-")
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

#[test]
fn service_names_are_short_distinct_and_plain() {
    assert_eq!(service_name("sb-0a1b-a1"), "sg-sb-0a1b-a1");
    let long = "sb-0123456789abcdef0123456789abcdef-a12";
    let odd = ["", "-", "A_B", "x--y", "sb.ü.1", long, "sb-1-"];
    let mut seen = std::collections::BTreeSet::new();
    for id in odd.iter().chain([&"sb-1", &"sb-2"]) {
        let name = service_name(id);
        assert!(valid(&name), "{id:?} -> {name:?}");
        assert!(seen.insert(name.clone()), "{id:?} -> {name:?} twice");
    }
    // Two long ids differing only at the end stay distinct.
    assert_ne!(
        service_name(&format!("{long}0")),
        service_name(&format!("{long}1"))
    );
}

#[test]
fn tags_round_trip_through_the_description() {
    let tags = Tags {
        sandbox_id: "sb-7".into(),
        attempt_id: "sb-7-a2".into(),
    };
    let text = description(&tags);
    assert_eq!(text, "sandgate_sandbox=sb-7 sandgate_attempt=sb-7-a2");
    assert_eq!(tags_of_description(Some(&text)), tags);
    let none = tags_of_description(Some("a service someone else made"));
    assert!(none.sandbox_id.is_empty() && none.attempt_id.is_empty());
    assert!(tags_of_description(None).sandbox_id.is_empty());
}

fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn account_options() {
    let key = || Secret::new("nf-token");
    let a = NorthflankAccount::from_options(None, &options(&[("project", "sbx")]), key()).unwrap();
    assert_eq!(a.base_url, DEFAULT_BASE_URL);
    assert_eq!((a.project.as_str(), a.team.as_deref()), ("sbx", None));
    assert_eq!(a.deployment_plan, DEFAULT_PLAN);
    assert_eq!(a.image, DEFAULT_IMAGE);
    assert_eq!(a.boot_timeout, Duration::from_secs(300));
    let missing = NorthflankAccount::from_options(None, &options(&[]), key()).unwrap_err();
    assert_eq!(missing.0, "options.project");
    let unknown =
        NorthflankAccount::from_options(None, &options(&[("project", "p"), ("x", "1")]), key())
            .unwrap_err();
    assert_eq!(unknown.0, "options.x");
    let empty =
        NorthflankAccount::from_options(None, &options(&[("project", "p"), ("team", " ")]), key())
            .unwrap_err();
    assert_eq!(empty.0, "options.team");
    let zero = NorthflankAccount::from_options(
        None,
        &options(&[("project", "p"), ("boot_timeout_secs", "0")]),
        key(),
    )
    .unwrap_err();
    assert_eq!(zero.0, "options.boot_timeout_secs");
}

fn adapter(team: Option<&str>) -> Northflank {
    let mut pairs = vec![("project", "sbx")];
    if let Some(team) = team {
        pairs.push(("team", team));
    }
    let account = NorthflankAccount::from_options(
        Some("http://127.0.0.1:9"),
        &options(&pairs),
        Secret::new("nf-token"),
    )
    .unwrap();
    let tls = crate::tls::upstream_client_config(&[]).unwrap();
    Northflank::new(account, tls).unwrap()
}

fn spec(source: Option<Source>, egress: Option<RemoteEgress>) -> CreateSpec {
    let request = sandgate_router::Request {
        source,
        ..Default::default()
    };
    CreateSpec {
        tags: Tags {
            sandbox_id: "sb-1".into(),
            attempt_id: "sb-1-a1".into(),
        },
        pool: "nf".into(),
        account: "nf".into(),
        request: Arc::new(request),
        env: BTreeMap::from([("A".to_string(), "1".to_string())]),
        snapshot: None,
        egress,
    }
}

#[test]
fn paths_follow_the_client() {
    let plain = adapter(None);
    assert_eq!(
        plain.service_path("sg-x", "/pause"),
        "/v1/projects/sbx/services/sg-x/pause"
    );
    let team = adapter(Some("acme"));
    assert_eq!(
        team.project_path("/services/deployment"),
        "/v1/teams/acme/projects/sbx/services/deployment"
    );
}

#[test]
fn the_create_body() {
    let nf = adapter(None);
    let body = nf.create_body(&spec(None, None));
    assert_eq!(body["name"], "sg-sb-1-a1");
    assert_eq!(
        body["description"],
        "sandgate_sandbox=sb-1 sandgate_attempt=sb-1-a1"
    );
    assert_eq!(body["billing"]["deploymentPlan"], DEFAULT_PLAN);
    assert_eq!(body["deployment"]["instances"], 1);
    assert_eq!(body["deployment"]["external"]["imagePath"], DEFAULT_IMAGE);
    assert_eq!(
        body["deployment"]["docker"]["customCommand"],
        DEFAULT_COMMAND
    );
    assert_eq!(body["runtimeEnvironment"], json!({"A": "1"}));
    assert!(body.get("runtimeFiles").is_none());
    // The request's image runs its own command; egress brings the variables and the CA file.
    let egress = RemoteEgress {
        proxy_url: "http://sb-1:t@gw.test:3128".into(),
        gateway_host: "gw.test".into(),
        gateway_port: 3128,
        ca_pem: "PEM".into(),
        lock_down: false,
    };
    let body = nf.create_body(&spec(
        Some(Source::Image("python:3.12".into())),
        Some(egress),
    ));
    assert_eq!(body["deployment"]["external"]["imagePath"], "python:3.12");
    assert!(body["deployment"].get("docker").is_none());
    assert_eq!(
        body["runtimeEnvironment"]["HTTPS_PROXY"],
        "http://sb-1:t@gw.test:3128"
    );
    assert_eq!(body["runtimeEnvironment"]["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(
        body["runtimeFiles"][CA_PATH],
        json!({"data": "UEVN", "encoding": "utf-8"})
    );
}
