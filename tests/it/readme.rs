//! The README's Quickstart runs: every ```sh block preceded by `<!-- readme-test: NAME -->`
//! is run, in order, as one bash script (`set -euo pipefail`) with the real `sandgate` on
//! `PATH`, in the directory of a real `sandgate serve` on its embedded defaults (its
//! listeners moved to free ports with `--listen`/`--api-listen`; `SANDGATE_URL` names the
//! API, the token is the local admin token the gateway wrote there). Needs root (local
//! sandboxes).
//!
//! CI has no network, so one thing is added to the embedded defaults: a stand-in for
//! `api.github.com`, a local HTTPS origin on `127.0.99.1:443` with a certificate from a test
//! CA. The gateway's config maps the name there (`[dns.hosts]`), trusts that CA
//! (`[tls] upstream_ca_files`) and lets the proxy dial that one loopback address
//! (`[egress] allow_private`); nothing else differs. The origin answers `/user` with a login
//! only when it receives the real token, which the sandbox never holds.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const README: &str = include_str!("../../README.md");

/// The marked blocks of `group`, in order.
fn blocks(readme: &str, group: &str) -> Vec<String> {
    let marker = format!("<!-- readme-test: {group} -->");
    let mut out = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() != marker {
            continue;
        }
        assert_eq!(
            lines.next().map(str::trim),
            Some("```sh"),
            "{marker} must precede a ```sh block"
        );
        let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        out.push(body.join("\n"));
    }
    out
}

/// `sandgate serve` in `dir` on free ports with `config`; the child and the API's URL.
fn serve(dir: &std::path::Path, config: &std::path::Path) -> (std::process::Child, String) {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .current_dir(dir)
        .env("SANDGATE_CONFIG", config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(Ok(line)) = lines.next() {
        if let Some(rest) = line.split("API on ").nth(1) {
            let api = rest.split(',').next().unwrap().to_string();
            // Keep draining stderr so the gateway never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return (child, api);
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("sandgate serve did not start listening");
}

#[test]
fn the_quickstart_blocks_run_against_a_real_gateway() {
    if !root_or_skip("readme::quickstart") {
        return;
    }
    let quickstart = blocks(README, "quickstart");
    assert!(
        quickstart.len() >= 3,
        "the Quickstart's tested blocks: {quickstart:?}"
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ca = TestCa::new();
    let github = runtime.block_on(fake_github(&ca));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("stand-in.toml");
    std::fs::write(
        &config,
        format!(
            "[dns.hosts]\n\"api.github.com\" = \"{GITHUB_IP}\"\n\
             [egress]\nallow_private = [\"{GITHUB_IP}/32\"]\n\
             [tls]\nupstream_ca_files = [{:?}]\n",
            ca.pem_path.display().to_string()
        ),
    )
    .unwrap();
    let (mut gateway, api) = serve(dir.path(), &config);
    let script = format!("set -euo pipefail\n{}\n", quickstart.join("\n"));
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("PATH", path_with_sandgate())
        .env("SANDGATE_URL", &api)
        .env_remove("SANDGATE_TOKEN")
        .env("GITHUB_TOKEN", "ghp_readme_test_0123456789")
        .output()
        .unwrap();
    let _ = gateway.kill();
    let _ = gateway.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // What the Quickstart promises: a table, a placeholder in the sandbox, a refusal the
    // sandbox reads, its line in the log, and the secret nowhere.
    assert!(stdout.contains("the sandbox holds sgph_"), "{stdout}");
    assert!(stdout.contains("egress_denied"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(" egress deny ") && l.contains("example.com")),
        "{stdout}"
    );
    assert!(!stdout.contains("ghp_readme_test") && !stderr.contains("ghp_readme_test"));
    // The credential step: the origin got the real token, and the log line names it.
    assert!(stdout.contains(r#""login":"readme-tester""#), "{stdout}");
    assert_eq!(github.load(Ordering::SeqCst), 1, "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(" egress allow GET api.github.com:443/user ")
                && l.ends_with("credentials: github")),
        "{stdout}"
    );
}

/// Where the stand-in for api.github.com listens (all of 127/8 is loopback).
const GITHUB_IP: &str = "127.0.99.1";

/// The stand-in for `https://api.github.com/user`: the login for the real token, 401
/// otherwise (never echoing what it got); counts the requests that carried the token.
async fn fake_github(ca: &TestCa) -> Arc<AtomicUsize> {
    let authorized: Arc<AtomicUsize> = Arc::default();
    let counter = authorized.clone();
    let router = axum::Router::new().route(
        "/user",
        axum::routing::get(move |headers: http::HeaderMap| {
            let counter = counter.clone();
            async move {
                let token = headers.get("authorization").and_then(|v| v.to_str().ok());
                if token != Some("Bearer ghp_readme_test_0123456789") {
                    let body = r#"{"message":"Bad credentials"}"#;
                    return (http::StatusCode::UNAUTHORIZED, body);
                }
                counter.fetch_add(1, Ordering::SeqCst);
                (http::StatusCode::OK, r#"{"login":"readme-tester"}"#)
            }
        }),
    );
    let tls = ca.server_config(&["api.github.com"]);
    serve_router_at(&format!("{GITHUB_IP}:443"), router, tls).await;
    authorized
}
