//! Telemetry that fits the ecosystem (issue 30, item 7), over real sockets:
//! - `/metrics`, scraped with reqwest and parsed strictly: `# HELP` and `# TYPE` before every
//!   family's samples, no series twice, the catalog's known series at zero before any
//!   traffic, and latency histograms (`_bucket` lines, no summary quantiles) after a real
//!   request through the proxy;
//! - a real `sandgate serve` process exporting traces over OTLP/HTTP to a collector this
//!   test runs (a real HTTP server decoding `ExportTraceServiceRequest`): after one create
//!   and one HTTPS request through the proxy, and a SIGTERM (which must flush), the
//!   collector holds `api.request > sandbox.create > sandbox.attempt` and
//!   `egress > egress.request > egress.{policy,credential,upstream}` with their attributes;
//! - the same process with `[telemetry] otlp_logs = true`: every decision record of an
//!   allowed and a denied request (carrying a secret header, a secret query value and a
//!   credential placeholder) arrives at the collector's `/v1/logs` as a `sandgate.decision`
//!   log record whose decision id, layer and outcome match `GET /v1/decisions`, and no secret
//!   is anywhere in what was exported.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{json, Value};

/// One sample line: family (name without `_bucket`/`_sum`/`_count`), full name, labels.
struct Sample {
    name: String,
    labels: String,
    value: f64,
}

/// Parses the text exposition strictly: every sample's family was announced by `# HELP` and
/// `# TYPE` before it, every line is a comment or `name{labels} value`, no series repeats.
/// Returns the samples and each family's type.
fn parse_exposition(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    let mut helped = BTreeSet::new();
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    let mut seen = BTreeSet::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP has text");
            assert!(!help.trim().is_empty(), "empty HELP: {line}");
            helped.insert(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(helped.contains(name), "TYPE before HELP for {name}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line}");
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').expect("labels close")),
            None => (series, ""),
        };
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad name: {line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "no TYPE before {line}");
        assert!(seen.insert(series.to_string()), "series twice: {series}");
        samples.push(Sample {
            name: name.to_string(),
            labels: labels.to_string(),
            value,
        });
    }
    (samples, types)
}

fn value(samples: &[Sample], name: &str, labels: &str) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.name == name && s.labels == labels)
        .map(|s| s.value)
}

async fn scrape(gateway: &Gateway) -> String {
    let response = reqwest::Client::new()
        .get(gateway.api("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let kind = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(kind.starts_with("text/plain"), "{kind}");
    response.text().await.unwrap()
}

#[tokio::test]
async fn metrics_have_help_zero_series_and_histograms() {
    let _scope = own_metrics();
    let origin = start_origin(None).await;
    let gateway = Gateway::start(GatewayOptions::default()).await;

    let (before, types) = parse_exposition(&scrape(&gateway).await);
    // Known series exist at zero before any traffic.
    for (name, labels) in [
        (
            "sandgate_egress_decisions_total",
            r#"phase="request",decision="allow""#,
        ),
        (
            "sandgate_egress_decisions_total",
            r#"phase="connect",decision="deny""#,
        ),
        (
            "sandgate_policy_decisions_total",
            r#"layer="creation",outcome="error""#,
        ),
        ("sandgate_proxy_tunnels_active", ""),
        ("sandgate_decision_log_dropped_total", ""),
        (
            "sandgate_proxy_decision_seconds_count",
            r#"phase="request""#,
        ),
        (
            "sandgate_policy_eval_seconds_bucket",
            r#"layer="egress",le="+Inf""#,
        ),
    ] {
        assert_eq!(
            value(&before, name, labels),
            Some(0.0),
            "{name}{{{labels}}}"
        );
    }
    for latency in [
        "sandgate_policy_eval_seconds",
        "sandgate_proxy_decision_seconds",
        "sandgate_api_request_seconds",
        "sandgate_change_delay_seconds",
    ] {
        assert_eq!(
            types.get(latency).map(String::as_str),
            Some("histogram"),
            "{latency}"
        );
    }

    let response = gateway
        .client("sb-a", true)
        .get(format!("http://plain.test:{}/hello", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let text = scrape(&gateway).await;
    assert!(!text.contains("quantile="), "a summary is exported");
    let (after, _) = parse_exposition(&text);
    let allowed = r#"phase="request",decision="allow""#;
    assert_eq!(
        value(&after, "sandgate_egress_decisions_total", allowed),
        Some(1.0)
    );
    assert_eq!(
        value(
            &after,
            "sandgate_proxy_decision_seconds_count",
            r#"phase="request""#
        ),
        Some(1.0)
    );
    let inf = value(
        &after,
        "sandgate_proxy_decision_seconds_bucket",
        r#"phase="request",le="+Inf""#,
    );
    assert_eq!(inf, Some(1.0));
    let buckets = after
        .iter()
        .filter(|s| {
            s.name == "sandgate_proxy_decision_seconds_bucket"
                && s.labels.starts_with(r#"phase="request""#)
        })
        .count();
    assert!(buckets > 5, "{buckets} buckets");
    let evals = value(
        &after,
        "sandgate_policy_eval_seconds_count",
        r#"layer="egress""#,
    )
    .unwrap();
    assert!(evals >= 1.0, "{evals}");
    // The API's own latency: the first scrape was answered (2xx) before this one.
    let api = value(
        &after,
        "sandgate_api_request_seconds_count",
        r#"status_class="2xx""#,
    )
    .unwrap();
    assert!(api >= 1.0, "{api}");
}

/// What the test collector received: every span and log record, the resources' attributes,
/// and every logs request body as it came (to look for secrets in the raw bytes).
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    resource: Vec<KeyValue>,
    requests: usize,
    logs: Vec<LogRecord>,
    log_resource: Vec<KeyValue>,
    log_bodies: Vec<Vec<u8>>,
}

/// The collector's `/v1/logs`: decodes `ExportLogsServiceRequest` into `received`.
fn logs_route(received: Arc<Mutex<Received>>) -> axum::routing::MethodRouter {
    axum::routing::post(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let sink = received.clone();
            async move {
                assert_eq!(headers["content-type"], "application/x-protobuf");
                let request = ExportLogsServiceRequest::decode(body.clone()).expect("OTLP logs");
                let mut received = sink.lock().unwrap();
                received.log_bodies.push(body.to_vec());
                for rl in request.resource_logs {
                    received
                        .log_resource
                        .extend(rl.resource.map(|r| r.attributes).unwrap_or_default());
                    for sl in rl.scope_logs {
                        received.logs.extend(sl.log_records);
                    }
                }
                axum::http::StatusCode::OK
            }
        },
    )
}

async fn start_collector() -> (std::net::SocketAddr, Arc<Mutex<Received>>) {
    let received: Arc<Mutex<Received>> = Arc::default();
    let sink = received.clone();
    let logs = logs_route(received.clone());
    let app = axum::Router::new().route("/v1/logs", logs).route(
        "/v1/traces",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let sink = sink.clone();
                async move {
                    assert_eq!(headers["content-type"], "application/x-protobuf");
                    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    let mut received = sink.lock().unwrap();
                    received.requests += 1;
                    for rs in request.resource_spans {
                        received
                            .resource
                            .extend(rs.resource.map(|r| r.attributes).unwrap_or_default());
                        for ss in rs.scope_spans {
                            received.spans.extend(ss.spans);
                        }
                    }
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, received)
}

fn attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

const API_TOKEN: &str = "api-token-telemetry-0123456789ab";

fn otlp_config(
    dir: &std::path::Path,
    ca: &TestCa,
    collector: std::net::SocketAddr,
    telemetry: &str,
) -> String {
    let body = format!(
        r#"
[[api.tokens]]
token = "{API_TOKEN}"
principal = "alice"
workspace = "ws-t"
[dns.hosts]
"api.a.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.0/8"]
[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct"
egress = "gateway"
[telemetry]
otlp_endpoint = "http://{collector}"
service_name = "sandgate-telemetry-test"
resource = {{ "deployment.environment" = "it" }}
{telemetry}
"#
    );
    process_config(dir, "", "", &body).replacen(
        "[tls]\n",
        &format!(
            "[tls]\nupstream_ca_files = [{:?}]\n",
            ca.pem_path.display().to_string()
        ),
        1,
    )
}

/// Creates a sandbox through the API; its id and egress token.
async fn create_sandbox(api: std::net::SocketAddr) -> (String, String) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{api}/v1/sandboxes"))
        .bearer_auth(API_TOKEN)
        .json(&json!({"network": {"allow_domains": ["api.a.test"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let created: Value = response.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    (id, created["egress"]["token"].as_str().unwrap().to_string())
}

/// A secret a sandbox sends in its own requests (a header and a query value): never exported.
const SECRET: &str = "s3cret-value-that-must-not-leave-0123";
/// A well-formed credential placeholder (none is declared, so a request with it is refused).
const PLACEHOLDER: &str = "sgph_0123456789abcdef0123456789abcdef01234567";

/// One HTTPS GET through the proxy as the sandbox (retried while its identity propagates),
/// carrying [`SECRET`] in a header and in the query.
async fn egress_once(served: &Served, dir: &std::path::Path, id: &str, token: &str, port: u16) {
    let ca = std::fs::read(dir.join("certs/ca.pem")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let client = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(format!("http://{id}:{token}@{}", served.proxy)).unwrap())
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let url = format!("https://api.a.test:{port}/traced?token={SECRET}");
        let request = client
            .get(url)
            .header("authorization", format!("Bearer {SECRET}"));
        if matches!(request.send().await.map(|r| r.status()), Ok(s) if s == reqwest::StatusCode::OK)
        {
            return; // The client drops here: the tunnel closes and its span ends.
        }
        assert!(
            Instant::now() < deadline,
            "the sandbox's egress never worked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn terminate(served: &mut Served) {
    let pid = served.child.id() as libc::pid_t;
    // SAFETY: a plain signal to the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while served.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "sandgate did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// The one span named `name` whose parent is `parent`.
fn child<'a>(spans: &'a [Span], parent: &Span, name: &str) -> &'a Span {
    let found: Vec<_> = named(spans, name)
        .into_iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect();
    let names: Vec<_> = spans.iter().map(|s| &s.name).collect();
    assert_eq!(found.len(), 1, "{name} under {}: {names:?}", parent.name);
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_traces_reach_a_collector_with_parents_and_attributes() {
    init();
    let (collector, received) = start_collector().await;
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(&config, otlp_config(dir.path(), &ca, collector, "")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command.args(["serve", "--config"]).arg(&config);
    let mut served = serve_process(command);

    let (id, token) = create_sandbox(served.api).await;
    egress_once(&served, dir.path(), &id, &token, origin.port()).await;
    assert!(origin.count() >= 1);
    // The batch exporter waits 5 s before sending: what arrives now is the SIGTERM flush.
    terminate(&mut served);

    let received = received.lock().unwrap();
    assert!(received.requests >= 1, "nothing exported");
    let resource = &received.resource;
    assert_eq!(
        attr(resource, "service.name").as_deref(),
        Some("sandgate-telemetry-test")
    );
    assert_eq!(
        attr(resource, "deployment.environment").as_deref(),
        Some("it")
    );
    let spans = &received.spans;

    let create_call = named(spans, "api.request")
        .into_iter()
        .find(|s| attr(&s.attributes, "http.route").as_deref() == Some("/v1/sandboxes"))
        .expect("the create's API span");
    assert_eq!(
        attr(&create_call.attributes, "http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        attr(&create_call.attributes, "http.response.status_code").as_deref(),
        Some("201")
    );
    let create = child(spans, create_call, "sandbox.create");
    assert_eq!(attr(&create.attributes, "sandbox_id"), Some(id.clone()));
    assert_eq!(
        attr(&create.attributes, "workspace").as_deref(),
        Some("ws-t")
    );
    let attempt = child(spans, create, "sandbox.attempt");
    assert_eq!(attr(&attempt.attributes, "pool").as_deref(), Some("pool-a"));
    assert_eq!(
        attr(&attempt.attributes, "provider").as_deref(),
        Some("sim")
    );
    assert_eq!(
        attr(&attempt.attributes, "outcome").as_deref(),
        Some("placed")
    );

    let connection = named(spans, "egress")
        .into_iter()
        .find(|s| attr(&s.attributes, "sandbox").as_deref() == Some(id.as_str()))
        .expect("the egress connection's span");
    assert_eq!(
        attr(&connection.attributes, "workspace").as_deref(),
        Some("ws-t")
    );
    assert!(attr(&connection.attributes, "request_id").is_some());
    let request = child(spans, connection, "egress.request");
    assert!(attr(&request.attributes, "request_id").is_some());
    for phase in ["egress.policy", "egress.credential", "egress.upstream"] {
        let span = child(spans, request, phase);
        assert!(
            span.start_time_unix_nano >= request.start_time_unix_nano,
            "{phase}"
        );
        assert!(
            span.end_time_unix_nano <= request.end_time_unix_nano,
            "{phase}"
        );
    }
    // No secret became an attribute.
    for span in spans {
        for kv in &span.attributes {
            let text = format!("{:?}", kv.value);
            assert!(
                !text.contains(&token) && !text.contains(API_TOKEN),
                "{} leaks",
                kv.key
            );
        }
    }
}

/// One plain-HTTP GET through the proxy to a destination the sandbox may not reach, with a
/// placeholder, a secret header and a secret query value: refused with a 403.
async fn denied_once(served: &Served, id: &str, token: &str, port: u16) {
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{id}:{token}@{}", served.proxy)).unwrap())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let response = client
        .get(format!("http://denied.test:{port}/no?token={SECRET}"))
        .header("authorization", format!("Bearer {SECRET}"))
        .header("x-upstream-key", PLACEHOLDER)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
}

/// The sandbox's decision records from `GET /v1/decisions`, once an allowed and a denied
/// egress record are there (the writer thread files them asynchronously).
async fn listed_decisions(api: std::net::SocketAddr, id: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let body: Value = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://{api}/v1/decisions?sandbox={id}&limit=1000"))
            .bearer_auth(API_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let records = body["decisions"].as_array().cloned().unwrap_or_default();
        let egress = |d: &str| {
            records
                .iter()
                .any(|r| r["layer"] == "egress" && r["decision"] == d)
        };
        if egress("allow") && egress("deny") {
            return records;
        }
        assert!(Instant::now() < deadline, "records never listed: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_logs_carry_decision_records_without_secrets() {
    init();
    let (collector, received) = start_collector().await;
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sandgate.toml");
    let body = otlp_config(dir.path(), &ca, collector, "otlp_logs = true");
    std::fs::write(&config, body).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command.args(["serve", "--config"]).arg(&config);
    let mut served = serve_process(command);

    let (id, token) = create_sandbox(served.api).await;
    egress_once(&served, dir.path(), &id, &token, origin.port()).await;
    denied_once(&served, &id, &token, origin.port()).await;
    let listed = listed_decisions(served.api, &id).await;
    // Flushed on SIGTERM at the latest.
    terminate(&mut served);

    let received = received.lock().unwrap();
    assert_eq!(
        attr(&received.log_resource, "service.name").as_deref(),
        Some("sandgate-telemetry-test")
    );
    let exported: BTreeMap<String, &LogRecord> = received
        .logs
        .iter()
        .map(|l| (attr(&l.attributes, "decision_id").expect("an id"), l))
        .collect();
    for record in &listed {
        let decision_id = record["decision_id"].as_str().unwrap();
        let log = exported
            .get(decision_id)
            .unwrap_or_else(|| panic!("{decision_id} not exported: {record}"));
        assert_eq!(log.event_name, "sandgate.decision");
        let field = |key: &str| attr(&log.attributes, key);
        assert_eq!(field("layer").as_deref(), record["layer"].as_str());
        assert_eq!(field("decision").as_deref(), record["decision"].as_str());
        assert_eq!(field("sandbox").as_deref(), Some(id.as_str()));
        assert_eq!(field("workspace").as_deref(), Some("ws-t"));
        let (text, number) = match record["decision"] == "allow" {
            true => ("INFO", 9),
            false => ("WARN", 13),
        };
        assert_eq!(
            (log.severity_text.as_str(), log.severity_number),
            (text, number)
        );
        // The body is the record exactly as the decision log and the API have it.
        let Some(any_value::Value::StringValue(json)) =
            log.body.as_ref().and_then(|b| b.value.as_ref())
        else {
            panic!("body is not the record's JSON: {:?}", log.body);
        };
        assert_eq!(&serde_json::from_str::<Value>(json).unwrap(), record);
    }
    // Nothing secret in any byte exported: not the sandbox's own secret (in a header and
    // the query), the placeholder, its proxy token or the API token.
    assert!(!received.log_bodies.is_empty());
    for body in &received.log_bodies {
        let text = String::from_utf8_lossy(body);
        for secret in [SECRET, &PLACEHOLDER[5..], &token, API_TOKEN] {
            assert!(!text.contains(secret), "{secret} exported");
        }
    }
}
