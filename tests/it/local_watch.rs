//! Watching a local sandbox's directories (issue 31, item 3): the runtime's watch (a symlink
//! the sandbox plants never points it at the host; events; the recursive watch; its bounds;
//! its end with the sandbox), then `GET /v1/sandboxes/{id}/watch` through a real gateway
//! (server-sent events, refusals decided before the stream, `sandgate sandbox watch`), and
//! 501 from a provider that cannot watch.
//!
//! The local tests need root, as every local sandbox (`root_or_skip` decides).

use std::time::Duration;

use sandgate::localbox::{LocalRuntime, LocalboxError, WatchEvent, WatchLimits, Watcher};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use crate::common::*;
use crate::local_provider::{start, Env, TOKEN_A};
use crate::localbox::{id, run, runtime, runtime_tuned, spec, text};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");

async fn sh(rt: &LocalRuntime, id: &str, script: &str) {
    let out = run(rt, id, &["sh", "-c", script]).await;
    assert_eq!(out.code(), Some(0), "{script}: {}", text(&out.stderr));
}

/// The next event as `(type, name)` (an overflow as `("overflow", reason)`), or `None` when
/// the watch ended; panics after 10 s.
async fn next(watch: &mut Watcher) -> Option<(String, String)> {
    let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("an event within 10 s")?;
    Some(match event {
        WatchEvent::Fs { kind, name } => (kind.as_str().to_string(), name),
        WatchEvent::Overflow { reason } => ("overflow".to_string(), reason),
    })
}

/// Nothing arrives for `quiet`.
async fn silent(watch: &mut Watcher, quiet: Duration) {
    if let Ok(event) = tokio::time::timeout(quiet, watch.next()).await {
        panic!("expected no event, got {event:?}");
    }
}

/// Reads events until `last` arrives; all of them.
async fn until(watch: &mut Watcher, last: (&str, &str)) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    loop {
        let event = next(watch)
            .await
            .unwrap_or_else(|| panic!("ended: {seen:?}"));
        let done = event.0 == last.0 && event.1 == last.1;
        seen.push(event);
        if done {
            return seen;
        }
    }
}

fn not_found(e: &LocalboxError) -> bool {
    matches!(e, LocalboxError::File { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_cannot_point_a_watch_at_the_host() {
    let Some((rt, _dir)) = runtime("watch_escape", vec![]) else {
        return;
    };
    let id = id("watch-escape");
    rt.create(spec(&id)).await.expect("create");
    // A host directory outside the sandbox, named as an attacker inside would name it.
    let host = tempfile::tempdir().unwrap();
    let h = host.path().display().to_string();
    sh(
        &rt,
        &id,
        &format!(
            "ln -s {h} abs && ln -s ../../../../../../../..{h} rel && mkdir tree && ln -s {h} tree/link"
        ),
    )
    .await;
    // Inside the root nothing has that name: the links dangle, there is nothing to watch.
    for link in ["abs", "rel", "tree/link"] {
        let refused = rt.watch(&id, link, false).await.unwrap_err();
        assert!(not_found(&refused), "{link}: {refused}");
    }
    // The sandbox makes a directory of that name of its own: the links reach that one.
    sh(&rt, &id, &format!("mkdir -p {h}")).await;
    let mut abs = rt.watch(&id, "abs", false).await.expect("watch abs");
    let mut rel = rt.watch(&id, "rel", false).await.expect("watch rel");
    let mut tree = rt
        .watch(&id, "/home/user/tree", true)
        .await
        .expect("watch tree");
    std::fs::write(host.path().join("host-secret.txt"), "x").unwrap();
    sh(&rt, &id, &format!("echo in > {h}/inside.txt")).await;
    for watch in [&mut abs, &mut rel] {
        let first = next(watch).await.expect("an event");
        assert_eq!(first, ("create".into(), "inside.txt".into()));
    }
    // The recursive watch reports the link as an entry and never descends into it.
    silent(&mut tree, Duration::from_millis(500)).await;
    rt.delete(&id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_changes_recursively_and_ends_with_the_sandbox() {
    let Some((rt, _dir)) = runtime("watch_events", vec![]) else {
        return;
    };
    let id = id("watch-events");
    rt.create(spec(&id)).await.expect("create");
    sh(&rt, &id, "mkdir -p old/inner").await;
    let mut watch = rt.watch(&id, "/home/user", true).await.expect("watch");
    // The tree that was there is watched; `d` is watched when its create arrives (hence the
    // pause before writing into it).
    sh(
        &rt,
        &id,
        "echo a > old/inner/a && mkdir d && sleep 0.5 && echo hi > d/f && chmod 600 d/f && mv d/f d/g && rm d/g",
    )
    .await;
    let seen = until(&mut watch, ("remove", "d/g")).await;
    let expected = [
        ("create", "old/inner/a"),
        ("write", "old/inner/a"),
        ("create", "d"),
        ("create", "d/f"),
        ("write", "d/f"),
        ("chmod", "d/f"),
        ("rename", "d/f"),
        ("create", "d/g"),
        ("remove", "d/g"),
    ];
    // In this order (the kernel may add events between, e.g. `chmod` of a link count).
    let mut rest = seen.iter();
    for want in expected {
        assert!(
            rest.any(|(k, n)| k == want.0 && n == want.1),
            "{want:?} missing or out of order in {seen:?}"
        );
    }
    // A stop ends the watch.
    rt.stop(&id).await.expect("stop");
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while watch.next().await.is_some() {}
    })
    .await;
    assert!(end.is_ok(), "the watch outlived the sandbox's stop");
    let refused = rt.watch(&id, "/home/user", false).await.unwrap_err();
    assert!(matches!(refused, LocalboxError::State { .. }), "{refused}");
    rt.delete(&id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_bounded_and_say_when_events_were_lost() {
    let limits = WatchLimits {
        dirs: 3,
        watchers: 2,
        queue: 4,
    };
    let Some((rt, _dir)) = runtime_tuned("watch_bounds", |c| c.watch = limits) else {
        return;
    };
    let id = id("watch-bounds");
    rt.create(spec(&id)).await.expect("create");
    sh(&rt, &id, "mkdir -p a/b c/d").await;
    // Five directories: past the limit of three, refused whole.
    let refused = rt.watch(&id, "/home/user", true).await.unwrap_err();
    assert!(
        refused.to_string().contains("more than 3 directories"),
        "{refused}"
    );

    // A reader that falls behind: four events wait, the rest are dropped, and the next
    // event it gets is the overflow, then what came after.
    let mut slow = rt.watch(&id, "/home/user", false).await.expect("watch");
    sh(&rt, &id, "for i in $(seq 1 40); do : > f$i; done").await;
    // Time for the watch to read all 40 from the kernel (microseconds each), so none is
    // still unread when the reader frees the queue.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 1..=4 {
        assert_eq!(
            next(&mut slow).await.unwrap(),
            ("create".to_string(), format!("f{i}"))
        );
    }
    silent(&mut slow, Duration::from_millis(300)).await;
    sh(&rt, &id, ": > last").await;
    let lost = next(&mut slow).await.unwrap();
    assert_eq!(lost.0, "overflow", "{lost:?}");
    assert!(lost.1.contains("fell behind"), "{lost:?}");
    assert_eq!(
        next(&mut slow).await.unwrap(),
        ("create".into(), "last".into())
    );

    // Two watchers at once, no third.
    let mut tree = rt.watch(&id, "/home/user/c", true).await.expect("watch c");
    let third = rt.watch(&id, "/home/user", false).await.unwrap_err();
    assert!(third.to_string().contains("2 watches"), "{third}");
    // `slow` holds one directory, `c` two: a new subdirectory of `c` is past the limit.
    sh(&rt, &id, "mkdir c/e").await;
    assert_eq!(
        next(&mut tree).await.unwrap(),
        ("create".into(), "e".into())
    );
    let lost = next(&mut tree).await.unwrap();
    assert_eq!(lost.0, "overflow", "{lost:?}");
    assert!(lost.1.contains("e is not watched"), "{lost:?}");
    // Ending a watch gives its share back.
    drop(slow);
    let mut again = None;
    for _ in 0..50 {
        match rt.watch(&id, "/home/user/a", false).await {
            Ok(watch) => {
                again = Some(watch);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(again.is_some(), "a dropped watch kept its share");
    rt.delete(&id).await.expect("delete");
}

/// Reads a server-sent event stream: each `data:` line's JSON.
struct Sse {
    response: reqwest::Response,
    pending: Vec<u8>,
}

impl Sse {
    fn new(response: reqwest::Response) -> Sse {
        Sse {
            response,
            pending: Vec::new(),
        }
    }

    /// The next event's data; `None` when the stream ended. Panics after 15 s.
    async fn next(&mut self) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                if let Some(data) = line.strip_prefix(b"data:") {
                    return Some(serde_json::from_slice(data).expect("JSON data"));
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .expect("an event within 15 s")
                .expect("the stream reads");
            self.pending.extend_from_slice(&chunk?);
        }
    }

    async fn until(&mut self, want: &Value) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let event = self
                .next()
                .await
                .unwrap_or_else(|| panic!("ended: {seen:?}"));
            let done = &event == want;
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

async fn watch_request(env: &Env, id: &str, query: &str) -> reqwest::Response {
    env.http
        .get(env.gw.api(&format!("/v1/sandboxes/{id}/watch?{query}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
}

async fn sandbox_sh(env: &Env, id: &str, script: &str) {
    let response = env
        .exec_request(
            TOKEN_A,
            id,
            json!({"argv": ["sh", "-c", script], "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.contains(r#""code":0"#), "{script}: {text}");
}

const WATCH_POLICY: &str = r#"package sandgate.action

import rego.v1

deny contains "this test refuses watching /tmp" if {
	input.operation == "watch"
	startswith(input.file.path, "/tmp")
}

deny contains "this test refuses recursive watches of /home/user/private" if {
	input.operation == "watch"
	input.file.recursive
	startswith(input.file.path, "/home/user/private")
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_endpoint_streams_events_and_decides_refusals_first() {
    let policies = vec![("watch_policy.rego", WATCH_POLICY.to_string())];
    let Some(env) = start("watch_api", policies).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    sandbox_sh(&env, id, "mkdir private").await;

    let response = watch_request(&env, id, "path=/home/user&recursive=true").await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut events = Sse::new(response);
    sandbox_sh(&env, id, "mkdir sub && sleep 0.5 && echo hi > sub/x.txt").await;
    let seen = events
        .until(&json!({"type": "write", "name": "sub/x.txt"}))
        .await;
    assert!(
        seen.contains(&json!({"type": "create", "name": "sub"})),
        "{seen:?}"
    );
    assert!(
        seen.contains(&json!({"type": "create", "name": "sub/x.txt"})),
        "{seen:?}"
    );

    // Refusals are plain HTTP answers, before any stream.
    let refused = |query: &'static str| {
        let env = &env;
        async move {
            let response = watch_request(env, id, query).await;
            let status = response.status().as_u16();
            // A stream (200) would never end: bounded, so a wrong answer fails instead.
            let body = tokio::time::timeout(Duration::from_secs(5), response.json::<Value>())
                .await
                .unwrap_or_else(|_| panic!("{query}: a stream ({status}), not a refusal"))
                .unwrap();
            (status, body)
        }
    };
    let (status, body) = refused("path=/tmp").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "policy_denied", "{body}");
    assert_eq!(body["error"]["details"]["operation"], "watch", "{body}");
    assert_eq!(
        body["error"]["details"]["reasons"][0], "this test refuses watching /tmp",
        "{body}"
    );
    // Policy sees `recursive`: the same directory is refused recursively only.
    let (status, body) = refused("path=/home/user/private&recursive=true").await;
    assert_eq!(status, 403, "{body}");
    let allowed = watch_request(&env, id, "path=/home/user/private").await;
    assert_eq!(allowed.status(), 200);
    drop(allowed);
    for (query, want) in [
        ("path=../etc", 400),
        ("path=/home/user/sub/x.txt", 400),
        ("path=/home/user/missing", 404),
        ("recursive=true", 400),
    ] {
        let (status, body) = refused(query).await;
        assert_eq!(status, want, "{query}: {body}");
    }
    let unknown = env
        .http
        .get(env.gw.api("/v1/sandboxes/sb-nope/watch?path=/home/user"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    // A stop ends the stream, and it says so.
    let stopped = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{id}/stop")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert!(stopped.status().is_success(), "{}", stopped.status());
    events.until(&json!({"type": "end"})).await;
    assert_eq!(events.next().await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandgate_sandbox_watch_prints_events_until_the_sandbox_stops() {
    let Some(env) = start("watch_cli", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .args(["sandbox", "watch", id, "/home/user", "-o", "json"])
        .env("SANDGATE_URL", env.gw.api(""))
        .env("SANDGATE_TOKEN", TOKEN_A)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // The CLI says nothing until an event: write until one comes back.
    let mut first = None;
    for n in 0..40 {
        sandbox_sh(&env, id, &format!(": > cli-{n}.txt")).await;
        if let Ok(line) = tokio::time::timeout(Duration::from_millis(500), lines.next_line()).await
        {
            first = line.unwrap();
            break;
        }
    }
    let first: Value = serde_json::from_str(&first.expect("an event line")).unwrap();
    assert_eq!(first["type"], "create", "{first}");
    assert!(
        first["name"].as_str().unwrap().starts_with("cli-"),
        "{first}"
    );
    let stopped = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{id}/stop")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert!(stopped.status().is_success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the CLI exits when the sandbox stops")
        .unwrap();
    assert_eq!(status.code(), Some(0));

    // A refusal: the API's error on stderr and the not-found exit code.
    let out = tokio::process::Command::new(BIN)
        .args(["sandbox", "watch", id, "/home/user/missing", "-o", "table"])
        .env("SANDGATE_URL", env.gw.api(""))
        .env("SANDGATE_TOKEN", TOKEN_A)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.stdout.is_empty());
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_ne!(out.status.code(), Some(0), "{stderr}");
}

const SIMULATED: &str = r#"
[[api.tokens]]
token = "api-token-watch-sim-0123456789"
principal = "alice"
workspace = "ws-a"

[[providers]]
name = "sim"
kind = "simulated"
capabilities = { isolation = ["microvm"], egress = "gateway" }

[[accounts]]
name = "acct-a"
provider = "sim"

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
"#;

#[tokio::test]
async fn a_provider_that_cannot_watch_answers_501() {
    init();
    let gw = Gateway::start(GatewayOptions {
        extra_toml: SIMULATED.to_string(),
        ..GatewayOptions::default()
    })
    .await;
    let http = reqwest::Client::new();
    let token = "api-token-watch-sim-0123456789";
    let created: Value = http
        .post(gw.api("/v1/sandboxes"))
        .bearer_auth(token)
        .json(&json!({"routing": {"order": ["sim"]}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(created["placement"]["pool"], "pool-a", "{created}");
    let id = created["id"].as_str().unwrap();
    let response = http
        .get(gw.api(&format!("/v1/sandboxes/{id}/watch?path=/home/user")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 501);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unsupported", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("watch"),
        "{body}"
    );
}
