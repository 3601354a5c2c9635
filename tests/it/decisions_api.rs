//! Decisions you can query (issue 30, item 6): `GET /v1/decisions` (filters, paging,
//! authorization by role), `GET /v1/decisions/stream` (live, resumable with
//! `Last-Event-ID`), `sandgate logs` run as the binary, and `sandgate policy replay
//! --since` reading the records from the API. Real requests through the proxy (reqwest),
//! real API creates on a simulated provider, the real decision ring; the log sink is off,
//! so every record read here came from the ring.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const ADMIN: &str = "api-token-admin-0123456789";
const ALICE: &str = "api-token-alice-0123456789";
const BOB: &str = "api-token-bob-0123456789";

fn options() -> GatewayOptions {
    let mut options = GatewayOptions {
        extra_toml: format!(
            r#"
[[api.tokens]]
token = "{ADMIN}"
principal = "root"
workspace = "ops"
roles = ["admin"]
[[api.tokens]]
token = "{ALICE}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{BOB}"
principal = "bob"
workspace = "ws-b"
[create]
short_wait_ms = 3000
[[providers]]
name = "sim"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}
[[accounts]]
name = "acct-a"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
"#
        ),
        ..GatewayOptions::default()
    };
    options
        .identities
        .push(IdentitySpec::new("sb-b", "ws-b", vec![]));
    options
}

/// A gateway whose decision log sink is off (the ring alone keeps records).
async fn gateway() -> Gateway {
    let gw = Gateway::start(GatewayOptions {
        log_toml: Some("decisions = \"off\"".into()),
        ..options()
    })
    .await;
    assert!(!gw.decision_log.exists());
    gw
}

/// `GET path` with `token` (none: no Authorization): status and JSON.
async fn get(gw: &Gateway, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(gw.api(path));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// sb-a: `allowed` GETs to plain.test (allowed) and `denied` to api.b.test (not in its
/// list); sb-b: `denied` GETs to plain.test (it may reach nothing).
async fn traffic(gw: &Gateway, port: u16, allowed: usize, denied: usize) {
    let a = gw.client("sb-a", true);
    let b = gw.client("sb-b", true);
    for i in 0..allowed {
        let r = a
            .get(format!("http://plain.test:{port}/ok/{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    for i in 0..denied {
        let r = a
            .get(format!("http://api.b.test:{port}/no/{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        let r = b
            .get(format!("http://plain.test:{port}/b/{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
    }
}

/// Every record matching `query`, paged with `limit`, following `next_cursor`.
async fn all_pages(gw: &Gateway, query: &str, limit: usize, token: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!("/v1/decisions?{query}&limit={limit}{cursor}");
        let (status, body) = get(gw, &path, Some(token)).await;
        assert_eq!(status, 200, "{path}: {body}");
        let page = body["decisions"].as_array().unwrap();
        assert!(page.len() <= limit);
        out.extend(page.iter().cloned());
        match body["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return out,
        }
    }
}

/// Waits until the ring holds at least `n` egress records (the writer thread is async).
async fn wait_for(gw: &Gateway, n: usize) {
    for _ in 0..200 {
        let (_, body) = get(gw, "/v1/decisions?layer=egress&limit=1000", Some(ADMIN)).await;
        if body["decisions"].as_array().map_or(0, Vec::len) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fewer than {n} egress records in the ring");
}

#[tokio::test]
async fn decisions_are_filtered_paged_and_authorized_by_workspace() {
    let origin = start_origin(None).await;
    // The decision log goes to a file here; the ring is fed all the same.
    let gw = Gateway::start(options()).await;
    traffic(&gw, origin.port(), 5, 3).await;
    wait_for(&gw, 11).await;
    // A real API operation: a create in ws-a makes creation-layer policy records.
    let (status, created) = gw
        .api_post("/v1/sandboxes", ALICE, &json!({"labels": {"team": "ml"}}))
        .await;
    assert_eq!(status, 201, "{created}");

    // No token: 401, nothing shown.
    let (status, body) = get(&gw, "/v1/decisions", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthenticated");

    // The admin sees every workspace, newest first.
    let all = all_pages(&gw, "layer=egress", 1000, ADMIN).await;
    assert_eq!(all.len(), 11, "{all:?}");
    let stamps: Vec<&str> = all.iter().map(|r| r["ts"].as_str().unwrap()).collect();
    assert!(stamps.windows(2).all(|w| w[0] >= w[1]), "{stamps:?}");
    let workspaces: HashSet<&str> = all
        .iter()
        .map(|r| r["workspace"].as_str().unwrap())
        .collect();
    assert_eq!(workspaces, HashSet::from(["ws-a", "ws-b"]));

    // Paging with a small limit yields exactly the same records, in the same order.
    let paged = all_pages(&gw, "layer=egress", 2, ADMIN).await;
    let ids = |v: &[Value]| {
        v.iter()
            .map(|r| r["decision_id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&paged), ids(&all));
    assert_eq!(ids(&all).iter().collect::<HashSet<_>>().len(), 11);

    // Each filter.
    let denied = all_pages(&gw, "sandbox=sb-a&decision=deny", 100, ADMIN).await;
    assert_eq!(denied.len(), 3);
    assert!(denied
        .iter()
        .all(|r| r["host"] == "api.b.test" && r["sandbox"] == "sb-a"));
    let allowed = all_pages(&gw, "decision=allow&layer=egress", 100, ADMIN).await;
    assert_eq!(allowed.len(), 5);
    assert!(allowed.iter().all(|r| r["host"] == "plain.test"));
    let b = all_pages(&gw, "workspace=ws-b", 100, ADMIN).await;
    assert_eq!(b.len(), 3);
    assert!(b
        .iter()
        .all(|r| r["sandbox"] == "sb-b" && r["decision"] == "deny"));
    let creation = all_pages(&gw, "layer=creation", 100, ADMIN).await;
    assert!(!creation.is_empty());
    assert!(creation
        .iter()
        .all(|r| r["kind"] == "policy" && r["layer"] == "creation"));
    assert_eq!(
        all_pages(&gw, "since=1h&layer=egress", 100, ADMIN)
            .await
            .len(),
        11
    );
    assert!(all_pages(&gw, "since=2999-01-01T00:00:00Z", 100, ADMIN)
        .await
        .is_empty());

    // A workspace caller sees only its own workspace.
    let alice = all_pages(&gw, "layer=egress", 100, ALICE).await;
    assert_eq!(alice.len(), 8);
    assert!(alice.iter().all(|r| r["workspace"] == "ws-a"));
    let bob = all_pages(&gw, "", 100, BOB).await;
    assert_eq!(bob.len(), 3);
    assert!(bob.iter().all(|r| r["workspace"] == "ws-b"));
    let (status, body) = get(&gw, "/v1/decisions?workspace=ws-a", Some(BOB)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    let (_, body) = get(&gw, "/v1/decisions?sandbox=sb-a", Some(BOB)).await;
    assert_eq!(body["decisions"], json!([]));

    // Bad input: a stable code naming the field, and nothing echoed.
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("layer=nope", "layer"),
        ("decision=maybe", "decision"),
        ("since=yesterday", "since"),
        ("bogus=1", "query"),
        ("sandbox=%1b%5b2J", "sandbox"),
    ] {
        let (status, body) = get(&gw, &format!("/v1/decisions?{query}"), Some(ADMIN)).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{query}");
        assert_eq!(body["error"]["details"]["field"], field, "{query}");
    }
}

/// The next `decision` event of an SSE body: (id, record).
async fn next_decision(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut String,
) -> (u64, Value) {
    loop {
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if !frame.contains("event: decision") {
                continue;
            }
            let field = |name: &str| {
                frame
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap()
                    .trim()
                    .to_string()
            };
            return (
                field("id:").parse().unwrap(),
                serde_json::from_str(&field("data:")).unwrap(),
            );
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream is open")
            .unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

async fn open_stream(gw: &Gateway, query: &str, last: Option<u64>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .get(gw.api(&format!("/v1/decisions/stream?{query}")))
        .bearer_auth(ALICE);
    if let Some(id) = last {
        req = req.header("last-event-id", id.to_string());
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test]
async fn the_stream_delivers_live_decisions_and_resumes_with_last_event_id() {
    let origin = start_origin(None).await;
    let gw = gateway().await;
    traffic(&gw, origin.port(), 2, 0).await;
    wait_for(&gw, 2).await;

    // Without Last-Event-ID or since: only new decisions.
    let mut body = open_stream(&gw, "sandbox=sb-a", None).await.bytes_stream();
    let mut buf = String::new();
    let client = gw.client("sb-a", true);
    client
        .get(format!("http://api.b.test:{}/live", origin.port()))
        .send()
        .await
        .unwrap();
    let (first, record) = next_decision(&mut body, &mut buf).await;
    assert_eq!(record["path"], "/live");
    assert_eq!(record["decision"], "deny");
    drop(body);

    // Decisions made while disconnected come on resume, after the last id seen, in order;
    // other workspaces' never (sb-b is in ws-b, this caller in ws-a).
    for path in ["/gone/1", "/gone/2"] {
        client
            .get(format!("http://plain.test:{}{path}", origin.port()))
            .send()
            .await
            .unwrap();
    }
    gw.client("sb-b", true)
        .get(format!("http://plain.test:{}/other", origin.port()))
        .send()
        .await
        .unwrap();
    let mut body = open_stream(&gw, "", Some(first)).await.bytes_stream();
    let mut buf = String::new();
    let (second, r2) = next_decision(&mut body, &mut buf).await;
    let (third, r3) = next_decision(&mut body, &mut buf).await;
    assert!(first < second && second < third);
    assert_eq!(
        (r2["path"].as_str(), r3["path"].as_str()),
        (Some("/gone/1"), Some("/gone/2"))
    );
    // Then live again.
    client
        .get(format!("http://plain.test:{}/after", origin.port()))
        .send()
        .await
        .unwrap();
    let (_, r4) = next_decision(&mut body, &mut buf).await;
    assert_eq!(r4["path"], "/after");
    assert_eq!(r4["workspace"], "ws-a");

    // A Last-Event-ID that is not one: 400.
    let resp = reqwest::Client::new()
        .get(gw.api("/v1/decisions/stream"))
        .bearer_auth(ALICE)
        .header("last-event-id", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
}

fn logs(gw: &Gateway, args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("logs")
        .args(["--url", &gw.api("")])
        .args(args)
        .env("SANDGATE_TOKEN", ADMIN)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

// The binary is waited for synchronously: the gateway's API needs another worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandgate_logs_prints_one_line_per_decision_and_follows() {
    let origin = start_origin(None).await;
    let gw = gateway().await;
    let port = origin.port();
    traffic(&gw, port, 2, 1).await;
    wait_for(&gw, 4).await;

    let (code, out) = logs(&gw, &["--layer", "egress"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    // Oldest first: time, sandbox, layer, decision, destination, reason.
    let (time, rest) = lines[0].split_once(' ').unwrap();
    assert!(time.starts_with("20") && time.ends_with('Z'), "{out}");
    assert_eq!(
        rest,
        format!("sb-a egress allow GET plain.test:{port}/ok/0 -")
    );
    assert!(
        lines[2].contains(&format!("sb-a egress deny GET api.b.test:{port}/no/0 \"")),
        "{out}"
    );

    let (_, out) = logs(&gw, &["--deny", "--sandbox", "sb-b"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains(&format!("sb-b egress deny GET plain.test:{port}/b/0")),
        "{out}"
    );

    let (_, out) = logs(&gw, &["--json", "--limit", "2", "--layer", "egress"]);
    let records: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2);
    assert_eq!(records[1]["path"], "/b/0");
    // `--json` is an alias of `-o json`: the same bytes; `-o table` is the default's lines.
    let json_args = ["--limit", "2", "--layer", "egress"];
    let (code, o_json) = logs(&gw, &[&["-o", "json"][..], &json_args[..]].concat());
    assert_eq!(code, 0);
    assert_eq!(o_json, out);
    let (_, default) = logs(&gw, &["--layer", "egress"]);
    let (_, table) = logs(&gw, &["-o", "table", "--layer", "egress"]);
    assert_eq!(table, default);
    assert!(!table.contains('\u{1b}'), "{table}");
    // `-o wide`: the table's line, then the workspace and the record's kind.
    let (_, wide) = logs(&gw, &["-o", "wide", "--layer", "egress"]);
    for (wide, line) in wide.lines().zip(table.lines()) {
        let extra = wide.strip_prefix(line).unwrap_or_else(|| panic!("{wide}"));
        assert!(extra.ends_with(" egress"), "{wide}");
        assert_eq!(extra.split(' ').count(), 3, "{wide}");
    }
    let (code, _) = logs(&gw, &["--json", "-o", "table"]);
    assert_eq!(code, 2, "--json and -o conflict: a usage error");

    // A refusal: exit 1, stdout empty, the error on stderr (the CLI's output contract).
    let out = Command::new(BIN)
        .args(["logs", "--url", &gw.api(""), "--layer", "nope"])
        .env("SANDGATE_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: invalid_request: "), "{stderr}");
    // With -o json (or --json) the error is the API's body, still on stderr only.
    for flag in [&["-o", "json"][..], &["--json"][..]] {
        let out = Command::new(BIN)
            .args(["logs", "--url", &gw.api(""), "--layer", "nope"])
            .args(flag)
            .env("SANDGATE_TOKEN", ADMIN)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "");
        let body: Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    }

    // -f: a decision made after it started is printed while it runs.
    let mut child = Command::new(BIN)
        .arg("logs")
        .args(["-f", "--sandbox", "sb-a", "--url", &gw.api("")])
        .env("SANDGATE_TOKEN", ADMIN)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let client = gw.client("sb-a", true);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let line = loop {
        // Until the stream is open, a request may come before it: send until one is seen.
        client
            .get(format!("http://plain.test:{port}/followed"))
            .send()
            .await
            .unwrap();
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
            break line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "logs -f printed nothing"
        );
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        line.contains(&format!(
            "sb-a egress allow GET plain.test:{port}/followed -"
        )),
        "{line}"
    );
}

// The binary is waited for synchronously: the gateway's API needs another worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_replay_since_reads_the_records_from_the_api() {
    let origin = start_origin(None).await;
    let gw = gateway().await;
    traffic(&gw, origin.port(), 4, 2).await;
    wait_for(&gw, 8).await;
    let candidate = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&gw.policy_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, candidate.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let replay = |dir: &std::path::Path| {
        Command::new(BIN)
            .args([
                "policy",
                "replay",
                "--since",
                "1h",
                "--json",
                "--url",
                &gw.api(""),
            ])
            .arg("--against")
            .arg(dir)
            .env("SANDGATE_TOKEN", ADMIN)
            .output()
            .unwrap()
    };
    let same = replay(candidate.path());
    assert_eq!(same.status.code(), Some(0), "{same:?}");
    let report: Value = serde_json::from_slice(&same.stdout).unwrap();
    assert!(report["replayed"].as_u64().unwrap() >= 8, "{report}");
    std::fs::write(
        candidate.path().join("close_plain.rego"),
        "package sandgate.egress\nimport rego.v1\n\ndeny contains \"plain.test is closed\" if input.destination.host == \"plain.test\"\n",
    )
    .unwrap();
    let flipped = replay(candidate.path());
    assert_eq!(flipped.status.code(), Some(1), "{flipped:?}");
    let report: Value = serde_json::from_slice(&flipped.stdout).unwrap();
    // Exactly sb-a's four allowed requests flip (sb-b's were denied already).
    assert_eq!(report["flipped"], 4, "{report}");
    assert_eq!(report["groups"][0]["sandbox"], "sb-a");
    assert_eq!(report["groups"][0]["flip"], "allow→deny");
}

#[tokio::test]
async fn a_disabled_ring_answers_503_and_the_openapi_document_has_both_routes() {
    let gw = Gateway::start(GatewayOptions {
        log_toml: Some("decisions = \"off\"\ndecisions_ring = 0".into()),
        ..options()
    })
    .await;
    let (status, body) = get(&gw, "/v1/decisions", Some(ADMIN)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "decisions_unavailable");
    let (_, doc) = get(&gw, "/openapi.json", None).await;
    assert!(doc["paths"]["/v1/decisions"]["get"].is_object());
    assert!(doc["paths"]["/v1/decisions/stream"]["get"].is_object());
}

/// A sink that stops taking records (a pipe its reader no longer drains) never holds a
/// request and never grows the queue past `[log] decisions_queue`: records past the bound
/// are dropped and counted, and once the sink drains again every record is accounted for,
/// written or counted as dropped. The sink is a FIFO whose reader is open but does not
/// read, so the writer thread blocks in `write` once the pipe's buffer is full.
#[tokio::test]
async fn a_stalled_sink_drops_past_the_queue_bound_and_never_holds_a_request() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let _metrics = own_metrics();
    const REQUESTS: usize = 400;
    let origin = start_origin(None).await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("decisions.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Opened first and without blocking, so the gateway's open for writing finds a reader.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let gw = Gateway::start(GatewayOptions {
        log_toml: Some(format!(
            "decisions = {:?}\ndecisions_queue = 16",
            fifo.display().to_string()
        )),
        ..options()
    })
    .await;

    let client = gw.client("sb-a", true);
    let started = std::time::Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..REQUESTS {
        let sent = std::time::Instant::now();
        let r = client
            .get(format!("http://plain.test:{}/ok/{i}", origin.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        slowest = slowest.max(sent.elapsed());
    }
    let dropped = gw.metric("sandgate_decision_log_dropped_total").await as usize;
    // The pipe holds 64 KiB of records and the queue 16; everything past them was dropped
    // while the requests went on.
    assert!(
        dropped > REQUESTS / 2 && dropped < REQUESTS,
        "dropped {dropped} of {REQUESTS}"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a request took {slowest:?} ({:?} for all)",
        started.elapsed()
    );

    // Drain the pipe: the writer goes on, and written + dropped is every record.
    let mut written = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match reader.read(&mut buf) {
            Ok(n) => written.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading the FIFO: {e}"),
        }
        let lines = written.iter().filter(|b| **b == b'\n').count();
        if lines + dropped >= REQUESTS || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let records: Vec<Value> = written
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert!(records.iter().all(|r| r["kind"] == "egress"));
    assert_eq!(records.len() + dropped, REQUESTS, "written + dropped");
    assert_eq!(
        gw.metric("sandgate_decision_log_dropped_total").await as usize,
        dropped,
        "nothing more was dropped while the sink drained"
    );
    let mut queued = f64::NAN;
    for _ in 0..50 {
        queued = gw.metric("sandgate_decision_log_queued").await;
        if queued == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(queued, 0.0, "the queue gauge after the drain");
}

#[test]
fn a_decisions_queue_of_zero_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(&config, "[log]\ndecisions_queue = 0\n").unwrap();
    // Under `timeout`: a config wrongly accepted would serve forever.
    let out = Command::new("timeout")
        .args(["20", BIN, "serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("log.decisions_queue") && stderr.contains("between 1 and 1048576"),
        "{stderr}"
    );
}
