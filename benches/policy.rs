//! Policy evaluation benchmark: decisions per second and median evaluation time for every
//! layer, with the bundled policies and 1,000 workspaces of data at
//! `data.sandgate.workspaces`, under both evaluators. Figures, not a timed test:
//! `cargo bench --bench policy` (`SANDGATE_BENCH_ITERS` calls per layer, default 20 000).
//!
//! Each call is `PolicyEngine::evaluate(layer, input)` as the gateway makes it, with no
//! decision log attached (the log is written off the request path, and nothing is built
//! for it when it is off); the input is built once and cloned per call (a reference-count
//! increment). Every call is timed with `Instant`; the median and p99 are over all calls,
//! decisions/s is calls divided by the summed time, on one thread. Target: median < 10 µs.

use std::path::Path;
use std::time::{Duration, Instant};

use regorus::Value;
use sandgate::policy::{Evaluator, Layer, PolicyEngine};
use serde_json::json;

const WORKSPACES: usize = 1_000;
const TARGET: Duration = Duration::from_micros(10);

fn main() {
    // See src/main.rs: regorus captures a backtrace per discarded error when backtraces
    // are on, which doubles evaluation time; the gateway turns library backtraces off.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    let iters: usize = std::env::var("SANDGATE_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dir = policy_dir();
    println!(
        "policy evaluation: bundled policies, {WORKSPACES} workspaces of data, {iters} calls per layer, one thread"
    );
    println!(
        "{:<11} {:<12} {:>12} {:>11} {:>11} {:>9}",
        "layer", "evaluator", "decisions/s", "median", "p99", "< 10 µs"
    );
    let mut misses = Vec::new();
    for evaluator in [Evaluator::Bytecode, Evaluator::Interpreter] {
        let started = Instant::now();
        let engine = PolicyEngine::load_with(dir.path(), evaluator).expect("bundled policies load");
        let load = started.elapsed();
        let report = engine.report();
        for layer in Layer::ALL {
            let input = Value::from(input(layer.as_str()));
            let decision = engine.decide(layer, input.clone());
            assert!(
                decision.allowed,
                "the benchmark input for {layer} should be allowed: {:?}",
                decision.reasons
            );
            // Warm-up: worker VM and engine caches.
            for _ in 0..iters / 10 {
                std::hint::black_box(engine.decide(layer, input.clone()));
            }
            let mut times = Vec::with_capacity(iters);
            for _ in 0..iters {
                let input = input.clone();
                let t = Instant::now();
                let d = engine.decide(layer, input);
                times.push(t.elapsed());
                std::hint::black_box(d);
            }
            let total: Duration = times.iter().sum();
            times.sort();
            let median = times[times.len() / 2];
            let p99 = times[times.len() * 99 / 100];
            let per_sec = iters as f64 / total.as_secs_f64();
            let mode = if report.layers.bytecode.contains(&layer.as_str()) {
                format!("{evaluator:?}").to_lowercase()
            } else {
                "interpreter".to_string()
            };
            let ok = median < TARGET;
            if !ok && evaluator == Evaluator::Bytecode {
                misses.push(layer.as_str());
            }
            println!(
                "{:<11} {:<12} {:>12.0} {:>11} {:>11} {:>9}",
                layer,
                mode,
                per_sec,
                format!("{:.2} µs", median.as_secs_f64() * 1e6),
                format!("{:.2} µs", p99.as_secs_f64() * 1e6),
                if ok { "yes" } else { "NO" }
            );
        }
        println!(
            "  ({evaluator:?}: generation loaded in {:.1} ms)",
            load.as_secs_f64() * 1e3
        );
    }
    replay_rows(dir.path(), iters);
    if misses.is_empty() {
        println!(
            "target met: median under 10 µs for every layer with the default (bytecode) evaluator"
        );
    } else {
        println!("target missed (bytecode) for: {misses:?}");
    }
}

/// The bundled policies (not their tests) plus `data.json` with 1,000 workspaces.
/// `sandgate policy replay`'s throughput: a decision log of `iters` records (every layer in
/// turn, as the engine writes them) read, parsed, evaluated under the bytecode evaluator
/// and compared, end to end, beside the single-decision latency above.
fn replay_rows(dir: &Path, iters: usize) {
    let engine = PolicyEngine::load(dir).expect("bundled policies load");
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut text = String::new();
    for i in 0..iters {
        let layer = Layer::ALL[i % Layer::ALL.len()];
        let mut result = json!({"allow": true, "deny": []});
        if layer == Layer::Egress {
            result["action"] = "inspect".into();
        }
        let record = json!({
            "kind": "policy", "decision_id": format!("d{i}"), "layer": layer.as_str(),
            "input": input(layer.as_str()), "result": result, "labels": {"generation": 1},
        });
        text.push_str(&record.to_string());
        text.push('\n');
    }
    std::fs::write(log.path(), text).unwrap();
    let mut rates = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let report = sandgate::policy::replay::replay(log.path(), &engine).expect("replays");
        let elapsed = started.elapsed();
        assert_eq!((report.replayed, report.flipped), (iters, 0), "{report:?}");
        rates.push(iters as f64 / elapsed.as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let rate = rates[1];
    println!(
        "replay     {:<12} {:>12.0} {:>11}   ({iters} logged records of every layer: read, parse, evaluate, compare; median of 3)",
        "bytecode",
        rate,
        format!("{:.2} µs", 1e6 / rate),
    );
}

fn policy_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for entry in std::fs::read_dir(bundled).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".rego") && !name.ends_with("_test.rego") {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    let mut workspaces = serde_json::Map::new();
    for i in 0..WORKSPACES {
        let mut domains = serde_json::Map::new();
        for d in 0..10 {
            domains.insert(format!("svc{d}.ws{i}.example"), json!(true));
        }
        domains.insert("*.pypi.org".into(), json!(true));
        workspaces.insert(
            format!("ws{i}"),
            json!({
                "allow_domains": domains,
                "approved_pools": ["pool-a", "pool-b", format!("pool-ws{i}")],
                "blocked_operations": ["snapshot"],
                "blocked_programs": ["nc", "nmap"],
            }),
        );
    }
    std::fs::write(
        dir.path().join("data.json"),
        json!({"sandgate": {"workspaces": workspaces}}).to_string(),
    )
    .unwrap();
    dir
}

/// An allowed, realistic input for `layer`, in workspace ws500 (one of the 1,000).
fn input(layer: &str) -> serde_json::Value {
    let ws = "ws500";
    let principal = json!({"principal": "alice", "workspace": ws, "roles": ["member"]});
    let sandbox = json!({"id": "sb-4f0c", "workspace": ws, "labels": {"team": "ml"},
                         "allow_domains": ["api.github.com", "*.githubusercontent.com"],
                         "state": "running", "pool": "pool-a", "provider": "sim", "account": "acct-a"});
    match layer {
        "egress" => json!({
            "phase": "request",
            "sandbox": sandbox,
            "destination": {"host": "files.pypi.org", "port": 443, "ip": "151.101.0.223", "scheme": "https",
                            "match_names": ["files.pypi.org", "*.pypi.org", "*.org"]},
            "request": {"method": "GET", "path": "/packages/x.whl",
                        "headers": {"user-agent": "pip/24", "accept": "*/*", "accept-encoding": "gzip",
                                    "connection": "keep-alive", "host": "files.pypi.org"}}
        }),
        "credential" => json!({
            "credential": {"name": "github", "workspace": ws, "user": null,
                           "destinations": [{"host": "api.github.com", "ports": [], "methods": ["GET"], "path_prefix": "/repos/"}]},
            "sandbox": sandbox,
            "destination": {"host": "api.github.com", "port": 443, "ip": null, "scheme": "https",
                            "match_names": ["api.github.com", "*.github.com", "*.com"]},
            "request": {"method": "GET", "path": "/repos/acme/app"}
        }),
        "creation" | "provider" => json!({
            "phase": "admit",
            "principal": principal,
            "workspace": ws,
            "sandbox": {"id": "sb-4f0c", "workspace": ws, "labels": {"team": "ml"}},
            "request": {"workspace": ws, "credentials": ["github"], "provider": null, "fallback_providers": [],
                        "source": {"environment": "metal/python"},
                        "resources": {"cpu": 2.0, "memory_mb": 4096, "disk_gb": null, "gpu": null, "gpu_type": null},
                        "network": {"allow_domains": ["api.github.com"], "deny_all": false, "cidrs": [], "vpc": null},
                        "regions": ["us-east-1"], "labels": {"team": "ml"}, "routing": {}},
            "pool": {"name": "pool-a", "provider": "e2b", "provider_kind": "e2b", "account": "acct-a",
                     "geography": "us", "region": "us-east-1", "zone": null, "labels": {"environment": "staging"},
                     "vpc": null, "price": 1.2, "standby": false, "egress": "gateway"},
            "account": {"name": "acct-a", "provider": "e2b", "billing": "good", "labels": {}, "credential_bound": true},
            "attempt": {"number": 1}
        }),
        "lifecycle" => json!({
            "operation": "stop", "principal": principal, "workspace": ws, "sandbox": sandbox,
            "exec": null, "file": null
        }),
        _ => json!({
            "operation": "exec", "principal": principal, "workspace": ws, "sandbox": sandbox,
            "exec": {"argv": ["/usr/bin/python3", "-c", "print(1)"], "cwd": "/home/user"}, "file": null
        }),
    }
}
