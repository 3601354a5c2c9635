//! What the decision ring costs a proxied request: an in-process gateway with its decision
//! log sink `off`, once with the ring disabled (`[log] decisions_ring = 0`: no record is
//! built at all) and once with the default ring (every request builds its record, queues it,
//! and the writer thread serializes it into the ring), and a plain-HTTP origin on loopback.
//! One keep-alive client sends GETs through the proxy; rounds alternate between the two
//! gateways so drift on a shared machine hits both. Prints microseconds per request (median
//! of the rounds) and the ring's use afterwards.
//!
//! `cargo bench --bench decisions` (ROUNDS, REQUESTS per round from the environment).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sandgate::config::Config;
use sandgate::server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "bench-token-0123456789abcdef";

/// An HTTP/1.1 origin answering every request `200 ok`, keep-alive.
async fn origin() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(4096);
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = stream.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

async fn gateway(dir: &std::path::Path, ring: usize) -> Server {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for entry in std::fs::read_dir(repo).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rego") {
            std::fs::copy(&path, policies.join(path.file_name().unwrap())).unwrap();
        }
    }
    let p = |name: &str| dir.join(name).display().to_string();
    let toml = format!(
        r#"[proxy]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[tls]
ca_dir = {certs:?}
[dns.hosts]
"origin.test" = "127.0.0.1"
[policy]
dir = {policies:?}
[log]
decisions = "off"
level = "warn"
decisions_ring = {ring}
[store]
path = {db:?}
[secrets]
master_key_file = {key:?}
[local]
dir = {local:?}
snapshot_dir = {snaps:?}
[egress]
allow_private = ["127.0.0.0/8"]
[[egress.identities]]
id = "bench"
token = {TOKEN:?}
workspace = "bench"
allow_domains = ["origin.test"]
"#,
        certs = p("certs"),
        policies = p("policies"),
        db = p("data/sandgate.db"),
        key = p("data/master.key"),
        local = p("local/sandboxes"),
        snaps = p("local/snapshots"),
    );
    Server::start(Config::from_toml(&toml).unwrap())
        .await
        .unwrap()
}

/// CPU time (user + system) of this whole process so far, in microseconds: client, proxy,
/// writer thread and origin together, which on a loaded machine is steadier than wall time.
fn cpu_us() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// (wall, CPU) microseconds per request over `n` keep-alive GETs.
async fn round(client: &reqwest::Client, url: &str, n: usize) -> (f64, f64) {
    let (started, cpu) = (Instant::now(), cpu_us());
    for _ in 0..n {
        let r = client.get(url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    // Let the writer thread finish this round's records, so their CPU is counted here.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let wall = started.elapsed().as_secs_f64() * 1e6 / n as f64;
    (wall, (cpu_us() - cpu) / n as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sandgate::tls::install_default_provider();
    let (rounds, requests) = (env("ROUNDS", 9), env("REQUESTS", 1000));
    let origin = origin().await;
    let (off_dir, on_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let off = gateway(off_dir.path(), 0).await;
    let on = gateway(on_dir.path(), 10_000).await;
    let client = |server: &Server| {
        let proxy = format!("http://bench:{TOKEN}@{}", server.proxy_addr());
        reqwest::Client::builder()
            .proxy(reqwest::Proxy::http(proxy).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (c_off, c_on) = (client(&off), client(&on));
    let url = format!("http://origin.test:{}/bench", origin.port());
    // Warm-up: connections, policy VMs, caches.
    round(&c_off, &url, 200).await;
    round(&c_on, &url, 200).await;
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        t_off.push(round(&c_off, &url, requests).await);
        t_on.push(round(&c_on, &url, requests).await);
    }
    let wall = |t: &[(f64, f64)]| median(t.iter().map(|x| x.0).collect());
    let cpu = |t: &[(f64, f64)]| median(t.iter().map(|x| x.1).collect());
    println!(
        "{rounds} rounds x {requests} keep-alive GETs through the proxy (decision log sink off); medians"
    );
    println!("                                wall us/req   CPU us/req (whole process)");
    for (name, t) in [
        ("ring off (decisions_ring = 0)", &t_off),
        ("ring on (10000, 8 MiB)", &t_on),
    ] {
        println!("{name:<32}{:>10.1}{:>13.1}", wall(t), cpu(t));
    }
    println!(
        "{:<32}{:>+10.1}{:>+13.1}",
        "ring on - off",
        wall(&t_on) - wall(&t_off),
        cpu(&t_on) - cpu(&t_off)
    );
    let metrics = reqwest::get(format!("http://{}/metrics", on.api_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    if let Some(line) = metrics
        .lines()
        .find(|l| l.starts_with("sandgate_decision_ring_bytes"))
    {
        println!("{line}");
    }
}
