//! `GET /v1/sandboxes/{id}/events` and `sandgate sandbox create --wait` over real sockets:
//! an in-process gateway with simulated pools, reqwest streaming the body, `curl -N`, and the
//! built binary as a client.
//!
//! Topology: one simulated provider `sim`, pools `pool-a`, `pool-b`, `pool-c` on accounts
//! `acct-a`, `acct-b`, `acct-c`, tried in that order. The failover case: `pool-a`'s instance
//! fails while starting (slowly, so the create answers 202), `pool-b` has no capacity,
//! `pool-c` places it (slowly too, so a stream can be resumed while it is still in flight).

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const TOKEN_A: &str = "api-token-ws-a-0123456789";
const TOKEN_B: &str = "api-token-ws-b-0123456789";
const BIN: &str = env!("CARGO_BIN_EXE_sandgate");

const FAILOVER: &str = r#"
[simulated.pool-a]
latency_ms = { min = 1000, max = 1000 }
faults = { fail_before_running = 1.0 }
[simulated.pool-b]
faults = { capacity = 1.0 }
[simulated.pool-c]
latency_ms = { min = 1200, max = 1200 }
"#;

const ALL_FAIL: &str = r#"
[simulated.pool-a]
latency_ms = { min = 300, max = 300 }
faults = { fail_before_running = 1.0 }
[simulated.pool-b]
faults = { capacity = 1.0 }
[simulated.pool-c]
latency_ms = { min = 300, max = 300 }
faults = { fail_before_running = 1.0 }
"#;

fn config(sims: &str, create: &str) -> String {
    format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{TOKEN_B}"
principal = "bob"
workspace = "ws-b"

[create]
short_wait_ms = 300
janitor_interval_ms = 100
reconcile_window_ms = 1000
provisioning_window_ms = 300
retry_backoff_ms = 20
{create}

[[providers]]
name = "sim"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}

[[accounts]]
name = "acct-a"
provider = "sim"
[[accounts]]
name = "acct-b"
provider = "sim"
[[accounts]]
name = "acct-c"
provider = "sim"

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct-b"
[[pools]]
name = "pool-c"
provider = "sim"
account = "acct-c"
{sims}
"#
    )
}

async fn gateway(sims: &str, create: &str) -> Gateway {
    init();
    Gateway::start(GatewayOptions {
        extra_toml: config(sims, create),
        ..GatewayOptions::default()
    })
    .await
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn create(gw: &Gateway, body: Value) -> (u16, Value) {
    let resp = http()
        .post(gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_A)
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

fn events_url(gw: &Gateway, id: &str) -> String {
    gw.api(&format!("/v1/sandboxes/{id}/events"))
}

async fn open(gw: &Gateway, id: &str, token: &str, last: Option<&str>) -> reqwest::Response {
    let mut req = http().get(events_url(gw, id)).bearer_auth(token);
    if let Some(last) = last {
        req = req.header("last-event-id", last);
    }
    req.send().await.unwrap()
}

// ------------------------------------------------------------------ the test's own SSE reader

/// One event as this test reads it (its own parser: an oracle independent of the CLI's).
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    event: String,
    id: String,
    data: Value,
}

/// The complete events in `text` (blocks ended by a blank line), comments skipped.
fn parse(text: &str) -> Vec<Sse> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let (mut event, mut id, mut data) = (None, None, Vec::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event: ").or(line.strip_prefix("event:")) {
                event = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("id: ").or(line.strip_prefix("id:")) {
                id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ").or(line.strip_prefix("data:")) {
                data.push(v.to_string());
            }
        }
        if data.is_empty() {
            continue;
        }
        out.push(Sse {
            event: event.expect("every event has a type"),
            id: id.expect("every event has an id"),
            data: serde_json::from_str(&data.join("\n")).expect("data is JSON"),
        });
    }
    out
}

/// Reads a stream until `stop` says so (the connection is then dropped) or it ends; the
/// events and the raw text.
async fn read_until(
    mut resp: reqwest::Response,
    stop: impl Fn(&Sse) -> bool,
) -> (Vec<Sse>, String) {
    let mut raw = String::new();
    let read = async {
        while let Some(chunk) = resp.chunk().await.unwrap() {
            raw.push_str(std::str::from_utf8(&chunk).unwrap());
            let complete = &raw[..raw.rfind("\n\n").map_or(0, |i| i + 2)];
            if parse(complete).iter().any(&stop) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the stream went on for 30 s");
    let complete = &raw[..raw.rfind("\n\n").map_or(0, |i| i + 2)];
    let mut events = parse(complete);
    if let Some(at) = events.iter().position(&stop) {
        events.truncate(at + 1);
    }
    (events, raw)
}

async fn read_all(resp: reqwest::Response) -> (Vec<Sse>, String) {
    read_until(resp, |_| false).await
}

/// `kind`, plus the seq for attempt events and the state for state/done events.
fn shape(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e.event.as_str() {
            "attempt_started" | "attempt_ended" => {
                format!(
                    "{}({},{})",
                    e.event,
                    e.data["seq"],
                    e.data["pool"].as_str().unwrap()
                )
            }
            _ => format!("{}({})", e.event, e.data["state"].as_str().unwrap()),
        })
        .collect()
}

fn ids_increase(events: &[Sse]) {
    let ids: Vec<u64> = events.iter().map(|e| e.id.parse().unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids do not increase: {ids:?}"
    );
}

/// The live stream of the failover create, connected while the first state is `first`.
fn live_failover(first: &str) -> Vec<String> {
    let mut want = vec![
        format!("state({first})"),
        "attempt_started(1,pool-a)".into(),
    ];
    if first == "pending" {
        want.push("state(provisioning)".into());
    }
    want.extend(
        [
            "attempt_ended(1,pool-a)",
            "attempt_started(2,pool-b)",
            "attempt_ended(2,pool-b)",
            "attempt_started(3,pool-c)",
            "attempt_ended(3,pool-c)",
            "state(running)",
            "done(running)",
        ]
        .map(String::from),
    );
    want
}

fn assert_failover_data(events: &[Sse]) {
    let find = |kind: &str, seq: i64| {
        events
            .iter()
            .find(|e| e.event == kind && e.data["seq"] == seq)
            .unwrap_or_else(|| panic!("no {kind} {seq} in {events:?}"))
    };
    let started = &find("attempt_started", 1).data;
    assert_eq!(started["provider"], "sim");
    assert_eq!(started["account"], "acct-a");
    assert!(
        started["id"].is_string() && started["started_ms"].is_i64(),
        "{started}"
    );
    let first = &find("attempt_ended", 1).data;
    assert_eq!(first["outcome"], "advance", "{first}");
    assert_eq!(first["error_class"], "failed_before_running", "{first}");
    assert!(first["duration_ms"].as_i64().unwrap() >= 900, "{first}");
    assert!(first["message"]
        .as_str()
        .unwrap()
        .contains("failed while starting"));
    let second = &find("attempt_ended", 2).data;
    assert_eq!(second["outcome"], "advance", "{second}");
    assert_eq!(second["error_class"], "capacity", "{second}");
    let third = &find("attempt_ended", 3).data;
    assert_eq!(third["outcome"], "success", "{third}");
    assert_eq!(third["state"], "succeeded", "{third}");
    assert!(third["instance_id"].is_string(), "{third}");
    assert_eq!(third["error_class"], Value::Null);
    let done = &events.last().unwrap().data;
    assert_eq!(done["state"], "running");
    assert_eq!(done["error"], Value::Null);
    assert_eq!(done["placement"]["pool"], "pool-c", "{done}");
    let state = events.iter().find(|e| e.event == "state").unwrap();
    assert!(state.data["at_ms"].is_i64());
}

// ------------------------------------------------------------------ API

#[tokio::test(flavor = "multi_thread")]
async fn a_create_that_fails_over_twice_streams_in_record_order_and_resumes_after_last_event_id() {
    let gw = gateway(FAILOVER, "").await;
    let (status, created) = create(&gw, json!({})).await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let token = created["egress"]["token"].as_str().unwrap().to_string();
    let first = created["state"].as_str().unwrap().to_string();

    // curl -N alongside, when it is installed.
    let curl = which("curl").map(|curl| {
        tokio::process::Command::new(curl)
            .args(["-sS", "-N", "--max-time", "30", "-H"])
            .arg(format!("Authorization: Bearer {TOKEN_A}"))
            .arg(events_url(&gw, &id))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    });

    // One client follows from the start to the end; another drops after the first
    // attempt's end and resumes from its id while the create is still in flight.
    let full = async {
        let resp = open(&gw, &id, TOKEN_A, None).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        read_all(resp).await
    };
    let resumed = async {
        let resp = open(&gw, &id, TOKEN_A, None).await;
        let (head, _) = read_until(resp, |e| e.event == "attempt_ended").await;
        let last = head.last().unwrap().id.clone();
        let resp = open(&gw, &id, TOKEN_A, Some(&last)).await;
        assert_eq!(resp.status(), 200);
        let (tail, _) = read_all(resp).await;
        (head, tail)
    };
    let ((events, raw), (head, tail)) = tokio::join!(full, resumed);

    let first_seen = events[0].data["state"].as_str().unwrap();
    assert!(
        [first.as_str(), "provisioning"].contains(&first_seen),
        "{events:?}"
    );
    assert_eq!(shape(&events), live_failover(first_seen), "{raw}");
    ids_increase(&events);
    assert_failover_data(&events);
    assert!(!raw.contains(&token), "the egress token is in the stream");

    // The resumed connection got exactly the rest: nothing twice, nothing missed.
    assert_eq!(head.last().unwrap().data["seq"], 1);
    let at = events
        .iter()
        .position(|e| e.id == head.last().unwrap().id)
        .expect("the resumed id is one of the stream's");
    assert_eq!(tail, events[at + 1..].to_vec());

    if let Some(curl) = curl {
        let out = curl.wait_with_output().await.unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let by_curl = parse(&text);
        assert_eq!(shape(&by_curl), shape(&events), "{text}");
        ids_increase(&by_curl);
    } else {
        eprintln!("curl is not installed: the curl -N client was not run");
    }

    // Connecting late: every attempt in order, then the final state, then done.
    let (late, _) = read_all(open(&gw, &id, TOKEN_A, None).await).await;
    assert_eq!(
        shape(&late),
        [
            "attempt_started(1,pool-a)",
            "attempt_ended(1,pool-a)",
            "attempt_started(2,pool-b)",
            "attempt_ended(2,pool-b)",
            "attempt_started(3,pool-c)",
            "attempt_ended(3,pool-c)",
            "state(running)",
            "done(running)",
        ]
    );
    ids_increase(&late);
    // Resuming after the create ended, from the middle: only the rest, the same events.
    let mid = events
        .iter()
        .find(|e| e.event == "attempt_ended" && e.data["seq"] == 1)
        .unwrap();
    let (rest, _) = read_all(open(&gw, &id, TOKEN_A, Some(&mid.id)).await).await;
    let at = events.iter().position(|e| e.id == mid.id).unwrap();
    assert_eq!(rest, events[at + 1..].to_vec());
    // After done, nothing more: 204 tells an EventSource to stop reconnecting.
    let done_id = &events.last().unwrap().id;
    let resp = open(&gw, &id, TOKEN_A, Some(done_id)).await;
    assert_eq!(resp.status(), 204);
    // An id this endpoint never sent is refused, naming the header.
    let resp = open(&gw, &id, TOKEN_A, Some("not-an-id")).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request");
    assert_eq!(body["error"]["details"]["field"], "Last-Event-ID");
}

/// Issue 25 item 12: a stream opened only after a create that failed over twice replays the
/// durable record as a live stream told it: each attempt started and ended, in order, then
/// the final state, then `done`. A reader that stops at `state: running` (as a client waiting
/// for its sandbox does) has then seen every attempt, not the final state alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_opened_after_a_failover_replays_every_attempt_before_the_final_state() {
    let gw = gateway(FAILOVER, "").await;
    let (status, created) = create(&gw, json!({})).await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    // No stream while the create runs: its end is waited for by reading the sandbox.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sandbox = gw.api_json(&format!("/v1/sandboxes/{id}"), TOKEN_A).await;
        if sandbox["state"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never placed: {sandbox}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let replay = [
        "attempt_started(1,pool-a)",
        "attempt_ended(1,pool-a)",
        "attempt_started(2,pool-b)",
        "attempt_ended(2,pool-b)",
        "attempt_started(3,pool-c)",
        "attempt_ended(3,pool-c)",
        "state(running)",
        "done(running)",
    ];
    let (late, raw) = read_all(open(&gw, &id, TOKEN_A, None).await).await;
    assert_eq!(shape(&late), replay, "{raw}");
    ids_increase(&late);
    assert_failover_data(&late);

    // A reader that stops at the first `state: running` has every attempt by then.
    let (until_running, _) = read_until(open(&gw, &id, TOKEN_A, None).await, |e| {
        e.event == "state" && e.data["state"] == "running"
    })
    .await;
    assert_eq!(shape(&until_running), replay[..7], "{raw}");

    // Resumed from any event of the replay: exactly the rest; after `done`, 204.
    for (at, event) in late.iter().enumerate() {
        let resp = open(&gw, &id, TOKEN_A, Some(&event.id)).await;
        if at + 1 == late.len() {
            assert_eq!(resp.status(), 204);
            continue;
        }
        let (rest, _) = read_all(resp).await;
        assert_eq!(rest, late[at + 1..].to_vec(), "resumed after event {at}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_create_ends_with_done_carrying_the_error() {
    let gw = gateway(ALL_FAIL, "").await;
    let (status, created) = create(&gw, json!({})).await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap();
    let (events, raw) = read_all(open(&gw, id, TOKEN_A, None).await).await;
    ids_increase(&events);
    let ended: Vec<&Sse> = events
        .iter()
        .filter(|e| e.event == "attempt_ended")
        .collect();
    assert_eq!(ended.len(), 3, "{raw}");
    assert!(
        ended.iter().all(|e| e.data["outcome"] == "advance"),
        "{raw}"
    );
    let done = events.last().unwrap();
    assert_eq!(done.event, "done", "{raw}");
    assert_eq!(done.data["state"], "failed");
    assert_eq!(done.data["placement"], Value::Null);
    assert_eq!(
        done.data["error"]["error"]["code"], "creation_failed",
        "{raw}"
    );
    assert!(done.data["error"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("every candidate pool was tried"));
    assert_eq!(
        events.iter().rev().nth(1).unwrap().data["state"],
        "failed",
        "the state event comes before done: {raw}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_and_other_workspace_ids_answer_the_same_404_as_read() {
    let gw = gateway("", "").await;
    let (status, created) = create(&gw, json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    for (who, sandbox) in [(TOKEN_B, id), (TOKEN_A, "sb-000000000000000000000000")] {
        let resp = open(&gw, sandbox, who, None).await;
        assert_eq!(resp.status(), 404);
        assert_eq!(resp.headers()["x-sandgate-error"], "not_found");
        let streamed: Value = resp.json().await.unwrap();
        let read: Value = http()
            .get(gw.api(&format!("/v1/sandboxes/{sandbox}")))
            .bearer_auth(who)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(streamed, read);
    }
    let resp = http().get(events_url(&gw, id)).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    // Documented as an event stream, each event type named.
    let doc: Value = http()
        .get(gw.api("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ok = &doc["paths"]["/v1/sandboxes/{id}/events"]["get"]["responses"]["200"];
    assert!(ok["content"]["text/event-stream"].is_object(), "{ok}");
    let description = ok["description"].as_str().unwrap();
    for kind in ["`state`", "`attempt_started`", "`attempt_ended`", "`done`"] {
        assert!(description.contains(kind), "{kind} in {description}");
    }
    // Its owner gets it: placed at once, the stream replays and ends at once.
    let (events, _) = read_all(open(&gw, id, TOKEN_A, None).await).await;
    assert_eq!(
        shape(&events),
        [
            "attempt_started(1,pool-a)",
            "attempt_ended(1,pool-a)",
            "state(running)",
            "done(running)"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_over_the_limit_are_429_and_a_stream_on_a_stuck_create_ends_at_its_lifetime() {
    let gw = gateway(
        "[simulated.pool-a]\nlatency_ms = { min = 20000, max = 20000 }\n",
        "event_streams_max = 2\nevent_stream_max_secs = 2",
    )
    .await;
    let (status, created) = create(&gw, json!({})).await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap();
    let started = Instant::now();
    let one = open(&gw, id, TOKEN_A, None).await;
    let two = open(&gw, id, TOKEN_A, None).await;
    assert_eq!((one.status().as_u16(), two.status().as_u16()), (200, 200));

    let three = open(&gw, id, TOKEN_A, None).await;
    assert_eq!(three.status(), 429);
    assert_eq!(three.headers()["retry-after"], "1");
    assert_eq!(three.headers()["x-sandgate-error"], "rate_limited");
    let body: Value = three.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");

    // Both end by themselves at the lifetime, without done, and free their slots.
    let ((a, raw), (b, _)) = tokio::join!(read_all(one), read_all(two));
    let lived = started.elapsed();
    assert!(
        lived >= Duration::from_millis(1500) && lived < Duration::from_secs(15),
        "{lived:?}"
    );
    for events in [&a, &b] {
        assert_eq!(
            shape(events),
            ["state(provisioning)", "attempt_started(1,pool-a)"],
            "{raw}"
        );
    }
    assert!(raw.contains(": stream lifetime reached"), "{raw}");
    let again = open(&gw, id, TOKEN_A, Some(&a.last().unwrap().id)).await;
    assert_eq!(again.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_frees_its_slot() {
    let gw = gateway(
        "[simulated.pool-a]\nlatency_ms = { min = 20000, max = 20000 }\n",
        "event_streams_max = 1",
    )
    .await;
    let (status, created) = create(&gw, json!({})).await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap();
    let one = open(&gw, id, TOKEN_A, None).await;
    assert_eq!(one.status(), 200);
    assert_eq!(open(&gw, id, TOKEN_A, None).await.status(), 429);
    drop(one);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let resp = open(&gw, id, TOKEN_A, None).await;
        if resp.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot of a closed stream was never freed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ------------------------------------------------------------------ CLI

struct Cli {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn cli(url: &str, args: &[&str], body: &Value) -> Cli {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("body.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .arg("-f")
        .arg(&file)
        .env("SANDGATE_URL", url)
        .env("SANDGATE_TOKEN", TOKEN_A)
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the CLI finished")
        .unwrap();
    Cli {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn base(gw: &Gateway) -> String {
    format!("http://{}", gw.server.api_addr())
}

/// The one JSON document on stdout.
fn document(out: &Cli) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// Lines of stderr, each with its numbers (durations) replaced by `N` and the sandbox id by
/// `ID`.
fn plain(stderr: &str, id: &str) -> Vec<String> {
    stderr
        .lines()
        .map(|l| {
            let l = l.replace(id, "ID");
            let mut out = String::new();
            let mut words = l.split(' ').peekable();
            while let Some(w) = words.next() {
                let is_ms = words.peek().is_some_and(|n| *n == "ms" || *n == "ms:")
                    && w.parse::<u64>().is_ok();
                out.push_str(if is_ms { "N" } else { w });
                out.push(' ');
            }
            out.trim_end().to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn create_wait_prints_one_plain_line_per_event_and_exits_0_when_running() {
    let gw = gateway(FAILOVER, "").await;
    let out = cli(&base(&gw), &["sandbox", "create", "--wait"], &json!({})).await;
    assert_eq!(out.code, Some(0), "{}\n{}", out.stderr, out.stdout);
    let sandbox = document(&out);
    let id = sandbox["id"].as_str().unwrap();
    assert_eq!(sandbox["state"], "running");
    assert_eq!(sandbox["placement"]["pool"], "pool-c");
    let token = sandbox["egress"]["token"]
        .as_str()
        .expect("the create's token is kept");
    assert!(!out.stderr.contains(token));
    let lines = plain(&out.stderr, id);
    let mut want: Vec<String> = vec![];
    if lines[0] == "sandbox ID: pending" {
        want.extend(
            [
                "sandbox ID: pending",
                "attempt 1 on pool pool-a (sim/acct-a): started",
                "sandbox ID: provisioning",
            ]
            .map(String::from),
        );
    } else {
        want.extend(
            [
                "sandbox ID: provisioning",
                "attempt 1 on pool pool-a (sim/acct-a): started",
            ]
            .map(String::from),
        );
    }
    want.extend(
        [
            "attempt 1 on pool pool-a: advance (failed_before_running) N ms: simulated instance on pool pool-a failed while starting",
            "attempt 2 on pool pool-b (sim/acct-b): started",
            "attempt 2 on pool pool-b: advance (capacity) N ms: simulated capacity on pool pool-b",
            "attempt 3 on pool pool-c (sim/acct-c): started",
            "attempt 3 on pool pool-c: success N ms",
            "sandbox ID: running",
            "sandbox ID is running on pool pool-c (sim/acct-c)",
        ]
        .map(String::from),
    );
    assert_eq!(lines, want, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn create_wait_exits_1_with_the_reason_when_every_pool_fails() {
    let gw = gateway(ALL_FAIL, "").await;
    let out = cli(&base(&gw), &["sandbox", "create", "--wait"], &json!({})).await;
    assert_eq!(out.code, Some(1), "{}\n{}", out.stderr, out.stdout);
    let sandbox = document(&out);
    assert_eq!(sandbox["state"], "failed");
    let id = sandbox["id"].as_str().unwrap();
    let lines = plain(&out.stderr, id);
    assert_eq!(
        lines.iter().filter(|l| l.ends_with(": started")).count(),
        3,
        "{}",
        out.stderr
    );
    assert_eq!(
        lines[lines.len() - 2],
        "sandbox ID: failed",
        "{}",
        out.stderr
    );
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("sandbox ID failed: creation_failed: every candidate pool was tried"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn create_wait_on_a_create_placed_at_once_still_shows_its_attempts() {
    let gw = gateway("", "").await;
    let out = cli(&base(&gw), &["sandbox", "create", "--wait"], &json!({})).await;
    assert_eq!(out.code, Some(0), "{}\n{}", out.stderr, out.stdout);
    let sandbox = document(&out);
    assert!(sandbox["egress"]["token"].is_string(), "{sandbox}");
    let lines = plain(&out.stderr, sandbox["id"].as_str().unwrap());
    assert_eq!(
        lines,
        [
            "attempt 1 on pool pool-a (sim/acct-a): started",
            "attempt 1 on pool pool-a: success N ms",
            "sandbox ID: running",
            "sandbox ID is running on pool pool-a (sim/acct-a)",
        ],
        "{}",
        out.stderr
    );
}

/// A one-shot HTTP server answering every request with `answer`, recording each request's
/// head and body.
async fn recording_server(
    answer: &'static str,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let sink = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Head, then as many body bytes as Content-Length says.
            loop {
                let n = stream.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            sink.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf).to_string());
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
            let _ = stream.write_all(reply.as_bytes()).await;
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_only_adds_the_flag_to_the_body_and_does_not_follow() {
    let (url, seen) = recording_server(r#"{"dry_run":true,"plan":[]}"#).await;
    let body = json!({"labels": {"team": "a"}, "regions": ["eu"]});
    let out = cli(&url, &["sandbox", "create", "--dry-run", "--wait"], &body).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(document(&out), json!({"dry_run": true, "plan": []}));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "only the create was sent: {seen:?}");
    assert!(seen[0].starts_with("POST /v1/sandboxes "), "{}", seen[0]);
    let sent: Value = serde_json::from_str(seen[0].split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        sent,
        json!({"labels": {"team": "a"}, "regions": ["eu"], "dry_run": true})
    );
    // A body that is not an object cannot carry the flag.
    let out = cli(&url, &["sandbox", "create", "--dry-run"], &json!([1])).await;
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("--dry-run"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn create_wait_on_a_create_that_failed_at_once_shows_its_attempts_and_exits_1() {
    let gw = gateway(
        "[simulated.pool-a]\nfaults = { capacity = 1.0 }\n[simulated.pool-b]\nfaults = { quota = 1.0 }\n[simulated.pool-c]\nfaults = { outage = 1.0 }\n",
        "",
    )
    .await;
    let out = cli(&base(&gw), &["sandbox", "create", "--wait"], &json!({})).await;
    assert_eq!(out.code, Some(1), "{}\n{}", out.stderr, out.stdout);
    let sandbox = document(&out);
    assert_eq!(sandbox["state"], "failed", "{sandbox}");
    let lines = plain(&out.stderr, sandbox["id"].as_str().unwrap());
    assert_eq!(
        lines[lines.len() - 2],
        "sandbox ID: failed",
        "{}",
        out.stderr
    );
    let ended: Vec<&String> = lines.iter().filter(|l| l.contains(": advance (")).collect();
    assert_eq!(ended.len(), 3, "{}", out.stderr);
    assert!(ended[2].starts_with("attempt 3 on pool pool-c: advance (outage) N ms"));
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("sandbox ID failed: creation_failed: "),
        "{}",
        out.stderr
    );
}
