//! What a sandbox asking for random refused names costs the proxy: refused CONNECTs, each to
//! a new random name, each answered inside the tunnel (a leaf minted for the name, a TLS
//! handshake, one 403) until the identity's leaf budget is spent, then on the CONNECT.
//!
//! `cargo bench --bench deny_tunnel` (`SANDGATE_BENCH_NAMES` refused CONNECTs per run,
//! default 300, 8 at a time). Three runs in one invocation, each against its own `sandgate
//! serve` process (the binary of this build): `[proxy] deny_leaves_per_minute` unbounded,
//! then at its default (60), then `deny_mode = "connect"` (every refusal on the CONNECT: the
//! floor). The proxy's CPU is read from `/proc/<pid>/task/*/schedstat`
//! around the run, so the client's own TLS work is not counted; the figure is proxy CPU per
//! refused CONNECT.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "bench-token-0123456789";
const CONCURRENCY: usize = 8;

fn main() {
    let names: usize = std::env::var("SANDGATE_BENCH_NAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!("refused CONNECTs to {names} random names, {CONCURRENCY} at a time, one sandbox");
    println!(
        "{:<28} {:>9} {:>9} {:>12} {:>14}",
        "[proxy]", "in tunnel", "on CONNECT", "proxy CPU", "CPU / CONNECT"
    );
    let runs = [
        (
            "leaves unbounded",
            format!("deny_leaves_per_minute = {}", u32::MAX),
        ),
        (
            "leaves 60/min (default)",
            "deny_leaves_per_minute = 60".to_string(),
        ),
        ("deny_mode = connect", "deny_mode = \"connect\"".to_string()),
    ];
    for (label, proxy_toml) in runs {
        let dir = tempfile::tempdir().unwrap();
        let mut child = start(dir.path(), &proxy_toml);
        let proxy = wait_for_proxy(&mut child);
        let ca = std::fs::read(dir.path().join("certs/ca.pem")).unwrap();
        let pid = child.id();
        let before = cpu_secs(pid).unwrap();
        let (tunnel, connect) = rt.block_on(refuse_many(proxy, &ca, names));
        let cpu = cpu_secs(pid).unwrap() - before;
        println!(
            "{label:<28} {tunnel:>9} {connect:>9} {:>10.1} ms {:>11.3} ms",
            cpu * 1e3,
            cpu * 1e3 / names as f64
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn start(dir: &Path, proxy_toml: &str) -> std::process::Child {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for entry in std::fs::read_dir(repo).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rego") {
            std::fs::copy(&path, policies.join(path.file_name().unwrap())).unwrap();
        }
    }
    let p = |name: &str| dir.join(name).display().to_string();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n{proxy_toml}\n[api]\nlisten = \"127.0.0.1:0\"\n[tls]\nca_dir = {:?}\n[policy]\ndir = {:?}\n[store]\npath = {:?}\n[secrets]\nmaster_key_file = {:?}\n[local]\ndir = {:?}\nsnapshot_dir = {:?}\n[[egress.identities]]\nid = \"sb\"\ntoken = \"{TOKEN}\"\nworkspace = \"ws\"\nallow_domains = [\"allowed.test\"]\n",
        p("certs"), p("policies"), p("data/sandgate.db"), p("data/master.key"), p("local/sandboxes"), p("local/snapshots"),
    );
    std::fs::write(dir.join("sandgate.toml"), config).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["serve", "--config"])
        .arg(dir.join("sandgate.toml"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sandgate starts")
}

/// The proxy address from the startup line on stderr.
fn wait_for_proxy(child: &mut std::process::Child) -> SocketAddr {
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.strip_prefix("sandgate: proxy on http://") {
            let addr = rest.split_whitespace().next().unwrap().parse().unwrap();
            // Keep draining stderr so the child never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return addr;
        }
    }
    panic!("sandgate did not start");
}

/// Refused CONNECTs to `names` random names: (answered in the tunnel, on the CONNECT).
async fn refuse_many(proxy: SocketAddr, ca: &[u8], names: usize) -> (usize, usize) {
    let tls = Arc::new(client_config(ca));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (tls, next) = (tls.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let (mut tunnel, mut connect) = (0, 0);
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < names {
                match refuse_one(proxy, &tls).await {
                    true => tunnel += 1,
                    false => connect += 1,
                }
            }
            (tunnel, connect)
        }));
    }
    let mut total = (0, 0);
    for task in tasks {
        let (t, c) = task.await.unwrap();
        total = (total.0 + t, total.1 + c);
    }
    total
}

/// One refused CONNECT to a name never asked before; true when it was answered inside the tunnel.
async fn refuse_one(proxy: SocketAddr, tls: &Arc<rustls::ClientConfig>) -> bool {
    use base64::Engine as _;
    // Unique per CONNECT (each run is a fresh process with an empty leaf cache).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("n{n}.random.test");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("sb:{TOKEN}"));
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let head = format!(
        "CONNECT {name}:443 HTTP/1.1\r\nHost: {name}:443\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    if !buf[..n].starts_with(b"HTTP/1.1 200") {
        return false;
    }
    let server = rustls::pki_types::ServerName::try_from(name.clone()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls.clone());
    let mut tls = connector.connect(server, stream).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 403"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    true
}

fn client_config(ca: &[u8]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// CPU seconds used so far by every thread of `pid`.
fn cpu_secs(pid: u32) -> Option<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}
