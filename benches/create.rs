//! API overhead of sandbox creation: `POST /v1/sandboxes` against an instant simulated pool
//! (no provider latency), so what is measured is sandgate itself — body parsing, routing,
//! both admission policy layers, SQLite writes (sandbox, attempt, sample, idempotency key),
//! token sealing and identity registration — over a real socket with reqwest.
//!
//! Baseline in the same run: `GET /healthz` round trips on the same connection pool.
//!
//! Each suite runs once per SQLite durability mode (`[store] synchronous`), `full` (the
//! default) and `normal`, in the same run, so what a durable commit costs is read side by
//! side.
//!
//! Run: `cargo bench --bench create` (optional env: `CREATE_BENCH_N`, default 2000;
//! `CREATE_BENCH_CONCURRENCY`, default 16; `CREATE_BENCH_SYNC`, default `full,normal`).

use std::path::Path;
use std::time::{Duration, Instant};

use sandgate::config::Config;
use sandgate::server::Server;

const TOKEN: &str = "bench-token-0123456789abcdef";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn report(name: &str, mut samples: Vec<Duration>, wall: Duration) {
    samples.sort();
    println!(
        "{name:<44} n={:<6} p50={:>8.1} us  p99={:>8.1} us  {:>8.0} req/s",
        samples.len(),
        percentile(&samples, 0.50).as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
        samples.len() as f64 / wall.as_secs_f64()
    );
}

async fn start(dir: &Path, synchronous: &str) -> Server {
    let policy_dir = dir.join("policies");
    std::fs::create_dir_all(&policy_dir).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for entry in std::fs::read_dir(repo).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rego") {
            std::fs::copy(&path, policy_dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let toml = format!(
        r#"
[proxy]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[[api.tokens]]
token = "{TOKEN}"
principal = "bench"
workspace = "ws-bench"
[tls]
ca_dir = {certs:?}
[store]
path = {db:?}
synchronous = {synchronous:?}
[secrets]
master_key_file = {key:?}
[policy]
dir = {policies:?}
reload_interval_ms = 0
[log]
decisions = "off"
level = "warn"
[create]
janitor_interval_ms = 60000

[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "instant"
provider = "sim"
account = "acct"
"#,
        certs = dir.join("certs").display().to_string(),
        db = dir.join("data/sandgate.db").display().to_string(),
        key = dir.join("data/master.key").display().to_string(),
        policies = policy_dir.display().to_string(),
    );
    let config = Config::from_toml(&toml).unwrap();
    Server::start(config).await.unwrap()
}

fn main() {
    let n: usize = std::env::var("CREATE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let concurrency: usize = std::env::var("CREATE_BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    sandgate::tls::install_default_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let modes = std::env::var("CREATE_BENCH_SYNC").unwrap_or_else(|_| "full,normal".into());
    for mode in modes.split(',') {
        runtime.block_on(suite(n, concurrency, mode.trim()));
    }
}

async fn suite(n: usize, concurrency: usize, synchronous: &str) {
    {
        let dir = tempfile::tempdir().unwrap();
        let server = start(dir.path(), synchronous).await;
        let api = server.api_addr();
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        let health = format!("http://{api}/healthz");
        let create = format!("http://{api}/v1/sandboxes");
        let body = serde_json::json!({"labels": {"bench": "create"}, "source": {"environment": "metal/python"}});

        // Warm-up: connections, policy VMs, SQLite page cache.
        for _ in 0..50 {
            http.get(&health).send().await.unwrap();
            let r = http
                .post(&create)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
        }

        println!("sandgate create benchmark: instant simulated pool, [store] synchronous = {synchronous:?}, n={n}, sequential then {concurrency} concurrent");
        let mut samples = Vec::with_capacity(n);
        let wall = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            let r = http.get(&health).send().await.unwrap();
            r.bytes().await.unwrap();
            samples.push(t.elapsed());
        }
        report(
            "baseline GET /healthz (sequential)",
            samples,
            wall.elapsed(),
        );

        let mut samples = Vec::with_capacity(n);
        let wall = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            let r = http
                .post(&create)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.bytes().await.unwrap();
            samples.push(t.elapsed());
        }
        report("POST /v1/sandboxes (sequential)", samples, wall.elapsed());

        let mut samples = Vec::with_capacity(n);
        let wall = Instant::now();
        for (i, _) in (0..n).enumerate() {
            let t = Instant::now();
            let r = http
                .post(&create)
                .bearer_auth(TOKEN)
                .header("idempotency-key", format!("bench-{i}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.bytes().await.unwrap();
            samples.push(t.elapsed());
        }
        report(
            "POST /v1/sandboxes + Idempotency-Key (seq.)",
            samples,
            wall.elapsed(),
        );

        let per_task = n / concurrency.max(1);
        let wall = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..concurrency {
            let http = http.clone();
            let create = create.clone();
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                let mut samples = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let t = Instant::now();
                    let r = http
                        .post(&create)
                        .bearer_auth(TOKEN)
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 201);
                    r.bytes().await.unwrap();
                    samples.push(t.elapsed());
                }
                samples
            }));
        }
        let mut samples = Vec::new();
        for t in tasks {
            samples.extend(t.await.unwrap());
        }
        report(
            &format!("POST /v1/sandboxes ({concurrency} concurrent)"),
            samples,
            wall.elapsed(),
        );
        server.shutdown();
    }
}
