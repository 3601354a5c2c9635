//! Egress benchmark: the same client code against a local HTTPS origin, directly and
//! through sandgate (a separate release process), plus squid (ssl-bump) and mitmdump when
//! they are installed. Figures, not a timed test: `cargo bench --bench egress`.
//!
//! Settings come from environment variables (see `benches/README.md`); every throughput
//! or latency figure is the median of `SANDGATE_BENCH_REPEATS` runs, interleaved across the
//! routes so drift affects all of them alike.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;

use sandgate::identity::Identity;
use sandgate::policy::input::{
    destination_value, egress_input, request_value, sandbox_value, Destination, RequestFacts,
};
use sandgate::policy::PolicyEngine;

/// The origin's name: mapped to 127.0.0.1 by each proxy's own host table.
const HOST: &str = "origin.bench.test";
const TOKEN: &str = "bench-token-0123456789";
/// The origin's process, when it runs as one: its CPU counts as the bench side's.
static ORIGIN_PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
/// The ceiling route: an opaque CONNECT tunnel through sandgate (no interception).
const TUNNEL_ROUTE: &str = "opaque-tunnel";
/// Response body size of the origin (small on purpose: per-request overhead dominates).
const BODY_BYTES: usize = 128;

// ---------------------------------------------------------------------------------------
// Settings

struct Settings {
    secs: f64,
    warmup: f64,
    repeats: usize,
    conns: usize,
    h2_conns: usize,
    h2_streams: usize,
    newconn_concurrency: usize,
    moderate_conns: usize,
    moderate_rate: u64,
    policy_iters: usize,
    peers: bool,
    layout: Layout,
    origin: OriginMode,
    /// What was done about `RUST_BACKTRACE` (see `main`).
    backtrace_note: String,
}

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env() -> Settings {
        Settings {
            secs: env_or("SANDGATE_BENCH_SECS", 3.0),
            warmup: env_or("SANDGATE_BENCH_WARMUP_SECS", 0.5),
            repeats: env_or("SANDGATE_BENCH_REPEATS", 3usize).max(1),
            conns: env_or("SANDGATE_BENCH_CONNS", 16usize).max(1),
            h2_conns: env_or("SANDGATE_BENCH_H2_CONNS", 2usize).max(1),
            h2_streams: env_or("SANDGATE_BENCH_H2_STREAMS", 8usize).max(1),
            newconn_concurrency: env_or("SANDGATE_BENCH_NEWCONN_CONCURRENCY", 8usize).max(1),
            moderate_conns: env_or("SANDGATE_BENCH_MODERATE_CONNS", 4usize).max(1),
            moderate_rate: env_or("SANDGATE_BENCH_MODERATE_RATE", 1000u64).max(1),
            policy_iters: env_or("SANDGATE_BENCH_POLICY_ITERS", 20_000usize).max(100),
            peers: env_or("SANDGATE_BENCH_PEERS", 1u8) != 0,
            layout: Layout::from_env(),
            origin: match std::env::var("SANDGATE_BENCH_ORIGIN").as_deref() {
                Ok("process") | Err(_) => OriginMode::Process,
                Ok("in-process") => OriginMode::InProcess,
                Ok(other) => {
                    panic!("SANDGATE_BENCH_ORIGIN={other:?}: expected process or in-process")
                }
            },
            backtrace_note: String::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Core layout

/// Which cores the bench process (load generator + origin) and the proxy under test run on.
///
/// `split` (the default with 2+ cores) gives the bench process the first half of the cores
/// and every proxy the other half, for every route alike: the direct baseline runs its
/// client and origin on the same cores as when a proxy is in between, and the proxy never
/// competes with them for CPU. That is the layout of a real deployment (the proxy on its own
/// hardware) and of proxy benchmarks that put the load generator on another machine. With
/// `shared`, every process may use every core: on a small machine the figures then measure
/// how the machine's CPU is divided as much as the proxy.
#[derive(Clone, Debug)]
enum Layout {
    Shared,
    Split {
        bench: Vec<usize>,
        proxy: Vec<usize>,
    },
}

impl Layout {
    fn from_env() -> Layout {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let wanted = std::env::var("SANDGATE_BENCH_LAYOUT").unwrap_or_else(|_| "split".into());
        match wanted.as_str() {
            "shared" => Layout::Shared,
            "split" if cores < 2 => Layout::Shared,
            "split" => {
                let half = cores / 2;
                Layout::Split {
                    bench: (0..half).collect(),
                    proxy: (half..cores).collect(),
                }
            }
            other => panic!("SANDGATE_BENCH_LAYOUT={other:?}: expected split or shared"),
        }
    }

    fn describe(&self) -> String {
        match self {
            Layout::Shared => "shared: every process may use every core (SANDGATE_BENCH_LAYOUT=split separates them)".into(),
            Layout::Split { bench, proxy } => format!(
                "split: load generator + origin on cpu {bench:?} for every route (direct included), \
                 the proxy under test on cpu {proxy:?} (SANDGATE_BENCH_LAYOUT=shared lets them mix)"
            ),
        }
    }

    /// Confines the calling thread (and every thread it creates afterwards) to the bench cores.
    fn confine_bench(&self) {
        if let Layout::Split { bench, .. } = self {
            set_affinity(&cpu_set(bench)).expect("sched_setaffinity for the bench process");
        }
    }

    /// Makes `cmd` start on the proxy cores.
    fn confine_proxy(&self, cmd: &mut Command) {
        if let Layout::Split { proxy, .. } = self {
            use std::os::unix::process::CommandExt;
            let set = cpu_set(proxy);
            // SAFETY: sched_setaffinity is async-signal-safe and `set` is built before fork.
            unsafe {
                cmd.pre_exec(move || set_affinity(&set));
            }
        }
    }
}

fn cpu_set(cores: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        assert!(
            c < libc::CPU_SETSIZE as usize,
            "cpu {c} is beyond cpu_set_t"
        );
        // SAFETY: `c` is within the set's size (checked above).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

fn set_affinity(set: &libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

// ---------------------------------------------------------------------------------------
// Certificates (generated per run; nothing is committed)

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names` signed by this CA: (chain PEM, leaf then CA; PKCS#8 key PEM).
    fn leaf_pem(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().unwrap()),
            })
            .collect();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (
            format!("{}{}", cert.pem(), self.cert_pem),
            key.serialize_pem(),
        )
    }
}

/// A client config trusting only `ca_pem`, offering `alpn`, with session resumption off so
/// every new connection is a full handshake.
fn client_tls(ca_pem: &[u8], alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

// ---------------------------------------------------------------------------------------
// The origin: h1 and h2 over TLS, a fixed small body

/// The origin's TLS config from a chain and key in PEM, offering h2 and http/1.1.
fn origin_tls(chain_pem: &str, key_pem: &str) -> Arc<rustls::ServerConfig> {
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut chain_pem.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .unwrap()
        .expect("a private key");
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Where the origin runs (`SANDGATE_BENCH_ORIGIN`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum OriginMode {
    /// Its own process on the bench cores (default): as in reality, client and origin do not
    /// share a process, so direct requests cross a process boundary as proxied ones do.
    Process,
    /// A task in the bench process, on the load generator's runtime: direct requests then
    /// go from task to task on one thread, which no real client and origin ever do.
    InProcess,
}

/// The environment variable that makes this binary run as the origin process only.
const ORIGIN_CHILD_ENV: &str = "SANDGATE_BENCH_ORIGIN_CHILD";

/// The origin process: serves until its stdin closes (the bench exited or was killed).
fn origin_child_main(files: &str) {
    let (chain, key) = files.split_once(':').expect("chain:key paths");
    let tls = origin_tls(
        &std::fs::read_to_string(chain).unwrap(),
        &std::fs::read_to_string(key).unwrap(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(start_origin(tls));
    println!("origin {addr}");
    use std::io::Write as _;
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
}

/// The origin's address, and its process when it has one.
async fn origin(mode: OriginMode, ca: &Ca, dir: &Path) -> (SocketAddr, Option<ChildGuard>) {
    let (chain, key) = ca.leaf_pem(&[HOST]);
    if mode == OriginMode::InProcess {
        return (start_origin(origin_tls(&chain, &key)).await, None);
    }
    let (chain_path, key_path) = (dir.join("origin-chain.pem"), dir.join("origin-key.pem"));
    std::fs::write(&chain_path, chain).unwrap();
    std::fs::write(&key_path, key).unwrap();
    // Started after the bench confined itself, so it inherits the bench cores.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(
            ORIGIN_CHILD_ENV,
            format!("{}:{}", chain_path.display(), key_path.display()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning the origin process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("origin ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("origin process said {line:?}"));
    (
        addr,
        Some(ChildGuard {
            name: "origin",
            child,
        }),
    )
}

async fn start_origin(tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Bytes::from(vec![b'x'; BODY_BYTES]);
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .header(header::CONTENT_TYPE, "text/plain")
                                .body(Full::new(body))
                                .unwrap(),
                        )
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

// ---------------------------------------------------------------------------------------
// Child processes (sandgate and the peers), killed on drop, panics included

struct ChildGuard {
    name: &'static str,
    child: Child,
}

impl ChildGuard {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("[bench] stopped {} (pid {})", self.name, self.child.id());
    }
}

/// CPU seconds used so far by a process: the scheduler's exact run time of each of its
/// threads (`/proc/<pid>/task/*/schedstat`, nanoseconds). The tick-sampled `utime`/`stime`
/// of `/proc/<pid>/stat` are biased at low load, where work runs right after wakeups.
fn cpu_secs(pid: u32) -> Option<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue; // the thread exited in between
        };
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(addr).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn start_sandgate(
    dir: &Path,
    origin_ca: &Path,
    layout: &Layout,
) -> (ChildGuard, SocketAddr, Vec<u8>) {
    let ca_dir = dir.join("sandgate-certs");
    // The bundled policies, plus one rule: the `bench-tunnel` identity's CONNECTs pass
    // opaquely (the ceiling route: the same hop without interception).
    let policy_dir = dir.join("policies");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"),
        &policy_dir,
    );
    std::fs::write(
        policy_dir.join("bench_tunnel.rego"),
        "package sandgate.egress\n\nimport rego.v1\n\naction := \"tunnel\" if input.sandbox.labels.bench == \"tunnel\"\n",
    )
    .unwrap();
    let toml = format!(
        r#"[proxy]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[tls]
ca_dir = {ca_dir:?}
upstream_ca_files = [{origin_ca:?}]
[dns.hosts]
{HOST:?} = "127.0.0.1"
[policy]
dir = {policy_dir:?}
[log]
decisions = "off"
level = "warn"
[egress]
allow_private = ["127.0.0.0/8"]
[[egress.identities]]
id = "bench"
token = {TOKEN:?}
workspace = "bench"
allow_domains = [{HOST:?}]
[[egress.identities]]
id = "bench-tunnel"
token = {TOKEN:?}
workspace = "bench"
allow_domains = [{HOST:?}]
labels = {{ bench = "tunnel" }}
"#,
        ca_dir = ca_dir.display().to_string(),
        origin_ca = origin_ca.display().to_string(),
        policy_dir = policy_dir.display().to_string(),
    );
    let config_path = dir.join("sandgate.toml");
    std::fs::write(&config_path, toml).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    layout.confine_proxy(&mut cmd);
    let mut child = cmd
        .arg("serve")
        .arg("--config")
        .arg(&config_path)
        .env_remove("RUST_LOG")
        .env_remove("SANDGATE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the sandgate binary");
    let stderr = child.stderr.take().unwrap();
    let guard = ChildGuard {
        name: "sandgate",
        child,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if let Some(rest) = line.split("proxy on http://").nth(1) {
                if let Some(tx) = tx.take() {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                    continue;
                }
            }
            // Warnings (the configured level) are worth seeing next to the figures.
            eprintln!("[sandgate] {line}");
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("sandgate did not report its proxy address");
    let addr: SocketAddr = addr.parse().expect("proxy address");
    let ca_pem = std::fs::read(ca_dir.join("ca.pem")).expect("sandgate CA");
    (guard, addr, ca_pem)
}

fn start_squid(
    dir: &Path,
    origin_ca: &Path,
    layout: &Layout,
) -> Result<(ChildGuard, SocketAddr, Vec<u8>), String> {
    let squid = which("squid").ok_or("squid is not installed")?;
    let certgen = [
        "/usr/lib/squid/security_file_certgen",
        "/usr/libexec/squid/security_file_certgen",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .ok_or("squid's security_file_certgen (package squid-openssl) is missing")?;
    let sdir = dir.join("squid");
    std::fs::create_dir_all(&sdir).map_err(|e| e.to_string())?;
    let ca = Ca::new("bench squid CA");
    std::fs::write(sdir.join("ca.pem"), &ca.cert_pem).map_err(|e| e.to_string())?;
    std::fs::write(sdir.join("ca.key"), &ca.key_pem).map_err(|e| e.to_string())?;
    std::fs::copy(origin_ca, sdir.join("origin-ca.pem")).map_err(|e| e.to_string())?;
    std::fs::write(sdir.join("hosts"), format!("127.0.0.1 {HOST}\n")).map_err(|e| e.to_string())?;
    let db = sdir.join("ssl_db");
    let status = Command::new(&certgen)
        .arg("-c")
        .arg("-s")
        .arg(&db)
        .args(["-M", "4MB"])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err("security_file_certgen -c failed".into());
    }
    // As root, squid drops to its effective user, which must read and write these files.
    if is_root() {
        let _ = Command::new("chmod").arg("755").arg(dir).status();
        let _ = Command::new("chown")
            .args(["-R", "proxy:proxy"])
            .arg(&sdir)
            .status();
    }
    let port = free_port();
    let d = sdir.display();
    let conf = format!(
        "http_port 127.0.0.1:{port} ssl-bump generate-host-certificates=on dynamic_cert_mem_cache_size=4MB tls-cert={d}/ca.pem tls-key={d}/ca.key
sslcrtd_program {certgen} -s {d}/ssl_db -M 4MB
sslcrtd_children 2 startup=1 idle=1
acl step1 at_step SslBump1
ssl_bump peek step1
ssl_bump bump all
tls_outgoing_options cafile={d}/origin-ca.pem
hosts_file {d}/hosts
http_access allow all
cache deny all
access_log none
cache_store_log none
cache_log {d}/cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
shutdown_lifetime 0 seconds
via off
forwarded_for delete
workers 1
pinger_enable off
",
        certgen = certgen.display()
    );
    let conf_path = sdir.join("squid.conf");
    std::fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(squid);
    layout.confine_proxy(&mut cmd);
    let child = cmd
        .arg("-N")
        .arg("-f")
        .arg(&conf_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let guard = ChildGuard {
        name: "squid",
        child,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    if !wait_for_port(addr, Duration::from_secs(20)) {
        let log = std::fs::read_to_string(sdir.join("cache.log")).unwrap_or_default();
        return Err(format!("squid did not start listening; cache.log:\n{log}"));
    }
    Ok((guard, addr, ca.cert_pem.into_bytes()))
}

fn start_mitmdump(
    dir: &Path,
    origin_ca: &Path,
    layout: &Layout,
) -> Result<(ChildGuard, SocketAddr, Vec<u8>), String> {
    let mitmdump = which("mitmdump").ok_or("mitmdump is not installed")?;
    let confdir = dir.join("mitmproxy");
    std::fs::create_dir_all(&confdir).map_err(|e| e.to_string())?;
    let port = free_port();
    let mut cmd = Command::new(mitmdump);
    layout.confine_proxy(&mut cmd);
    let child = cmd
        .args(["--listen-host", "127.0.0.1", "--listen-port"])
        .arg(port.to_string())
        .arg("--set")
        .arg(format!("confdir={}", confdir.display()))
        .arg("--set")
        .arg(format!(
            "ssl_verify_upstream_trusted_ca={}",
            origin_ca.display()
        ))
        .args(["--set", "flow_detail=0", "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let guard = ChildGuard {
        name: "mitmdump",
        child,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    if !wait_for_port(addr, Duration::from_secs(30)) {
        return Err("mitmdump did not start listening".into());
    }
    let ca = std::fs::read(confdir.join("mitmproxy-ca-cert.pem"))
        .map_err(|e| format!("mitmproxy CA: {e}"))?;
    Ok((guard, addr, ca))
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------------
// The client: one code path for every route

struct ProxyHop {
    addr: SocketAddr,
    /// The CONNECT authority.
    authority: String,
    /// `Proxy-Authorization` value, when the proxy needs one.
    auth: Option<String>,
    pid: u32,
}

struct Route {
    name: &'static str,
    origin: SocketAddr,
    proxy: Option<ProxyHop>,
    tls_h1: Arc<rustls::ClientConfig>,
    tls_h2: Arc<rustls::ClientConfig>,
    h2: bool,
}

impl Route {
    fn new(
        name: &'static str,
        origin: SocketAddr,
        proxy: Option<ProxyHop>,
        ca_pem: &[u8],
        h2: bool,
    ) -> Route {
        Route {
            name,
            origin,
            proxy,
            tls_h1: client_tls(ca_pem, &[b"http/1.1"]),
            tls_h2: client_tls(ca_pem, &[b"h2"]),
            h2,
        }
    }

    fn authority(&self) -> String {
        format!("{HOST}:{}", self.origin.port())
    }

    fn pid(&self) -> Option<u32> {
        self.proxy.as_ref().map(|p| p.pid)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A fresh TCP connection (through a CONNECT tunnel when the route has a proxy) and a TLS
/// session on it, SNI = the origin's name.
async fn open(route: &Route, h2: bool) -> Result<TlsStream<TcpStream>, BoxError> {
    let tcp = match &route.proxy {
        None => {
            let s = TcpStream::connect(route.origin).await?;
            s.set_nodelay(true)?;
            s
        }
        Some(proxy) => {
            let mut s = TcpStream::connect(proxy.addr).await?;
            s.set_nodelay(true)?;
            let a = &proxy.authority;
            let mut head = format!("CONNECT {a} HTTP/1.1\r\nHost: {a}\r\n");
            if let Some(auth) = &proxy.auth {
                head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
            }
            head.push_str("\r\n");
            s.write_all(head.as_bytes()).await?;
            // The proxy sends nothing after its answer until the ClientHello, so a plain
            // read until the end of the head is safe.
            let mut buf = [0u8; 2048];
            let mut n = 0;
            loop {
                let r = s.read(&mut buf[n..]).await?;
                if r == 0 {
                    return Err("proxy closed during CONNECT".into());
                }
                n += r;
                if buf[..n].ends_with(b"\r\n\r\n") {
                    break;
                }
                if n == buf.len() {
                    return Err("CONNECT answer too long".into());
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            if !(head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")) {
                return Err(
                    format!("CONNECT refused: {}", head.lines().next().unwrap_or("")).into(),
                );
            }
            s
        }
    };
    let config = if h2 { &route.tls_h2 } else { &route.tls_h1 };
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(ServerName::try_from(HOST).unwrap(), tcp)
        .await?;
    let alpn = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
    if h2 && alpn.as_deref() != Some(b"h2") {
        return Err("the server did not negotiate h2".into());
    }
    Ok(tls)
}

enum Sender {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
}

/// What a request looks like on each protocol: origin-form + Host (h1), or the absolute URI
/// that becomes `:authority` (h2).
#[derive(Clone)]
struct Target {
    uri: Uri,
    host: HeaderValue,
}

impl Target {
    fn new(route: &Route) -> Target {
        let authority = route.authority();
        Target {
            uri: format!("https://{authority}/").parse().unwrap(),
            host: HeaderValue::from_str(&authority).unwrap(),
        }
    }
}

impl Sender {
    async fn connect(route: &Route, h2: bool) -> Result<Sender, BoxError> {
        let tls = open(route, h2).await?;
        if h2 {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
            tokio::spawn(conn);
            Ok(Sender::H2(sender))
        } else {
            let (sender, conn) = http1::handshake(TokioIo::new(tls)).await?;
            tokio::spawn(conn);
            Ok(Sender::H1(sender))
        }
    }

    fn clone_h2(&self) -> Option<Sender> {
        match self {
            Sender::H2(s) => Some(Sender::H2(s.clone())),
            Sender::H1(_) => None,
        }
    }

    async fn get(&mut self, target: &Target) -> Result<(), BoxError> {
        let response = match self {
            Sender::H1(s) => {
                let req = Request::get("/")
                    .header(header::HOST, target.host.clone())
                    .body(Empty::new())?;
                s.ready().await?;
                s.send_request(req).await?
            }
            Sender::H2(s) => {
                let req = Request::get(target.uri.clone())
                    .version(Version::HTTP_2)
                    .body(Empty::new())?;
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            return Err(format!("status {status}: {}", String::from_utf8_lossy(&body)).into());
        }
        if body.len() != BODY_BYTES {
            return Err(format!("short body: {} bytes", body.len()).into());
        }
        Ok(())
    }

    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Measurements

#[derive(Default)]
struct WorkerOut {
    latencies_ns: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl WorkerOut {
    fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    /// Requests (or connections) per second.
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    errors: f64,
    /// Cores used by the proxy process during the window (None: direct).
    proxy_cores: Option<f64>,
    /// Cores used by the bench process (client and origin) during the window.
    bench_cores: f64,
}

struct Window {
    warm_end: Instant,
    end: Instant,
}

impl Window {
    fn new(s: &Settings) -> Window {
        let warm_end = Instant::now() + Duration::from_secs_f64(s.warmup);
        Window {
            warm_end,
            end: warm_end + Duration::from_secs_f64(s.secs),
        }
    }
}

/// Waits for the workers while sampling CPU over the measured window.
async fn collect(
    route: &Route,
    window: &Window,
    secs: f64,
    workers: Vec<tokio::task::JoinHandle<WorkerOut>>,
) -> (Sample, Option<String>) {
    let me = std::process::id();
    tokio::time::sleep_until(window.warm_end.into()).await;
    let bench_cpu = || {
        let origin = ORIGIN_PID.get().map(|pid| cpu_secs(*pid));
        match origin {
            Some(origin) => cpu_secs(me).zip(origin).map(|(a, b)| a + b),
            None => cpu_secs(me),
        }
    };
    let cpu0 = (route.pid().and_then(cpu_secs), bench_cpu());
    tokio::time::sleep_until(window.end.into()).await;
    let cpu1 = (route.pid().and_then(cpu_secs), bench_cpu());
    let mut all = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for w in workers {
        let out = w.await.expect("worker panicked");
        all.extend(out.latencies_ns);
        errors += out.errors;
        first_error = first_error.or(out.first_error);
    }
    all.sort_unstable();
    let pct = |p: usize| -> f64 {
        if all.is_empty() {
            return f64::NAN;
        }
        all[(all.len() * p / 100).min(all.len() - 1)] as f64 / 1000.0
    };
    let proxy_cores = cpu0.0.zip(cpu1.0).map(|(a, b)| (b - a) / secs);
    let bench_cores = match cpu0.1.zip(cpu1.1) {
        Some((a, b)) => (b - a) / secs,
        None => f64::NAN,
    };
    (
        Sample {
            rate: all.len() as f64 / secs,
            p50_us: pct(50),
            p99_us: pct(99),
            errors: errors as f64,
            proxy_cores,
            bench_cores,
        },
        first_error,
    )
}

/// Closed loop on keep-alive connections: each worker sends its next request as soon as the
/// previous answer is read.
async fn keepalive(route: &Route, h2: bool, s: &Settings) -> (Sample, Option<String>) {
    let target = Target::new(route);
    let mut senders = Vec::new();
    if h2 {
        for _ in 0..s.h2_conns {
            let conn = Sender::connect(route, true).await.expect("h2 connection");
            for _ in 0..s.h2_streams {
                senders.push(conn.clone_h2().unwrap());
            }
        }
    } else {
        for _ in 0..s.conns {
            senders.push(Sender::connect(route, false).await.expect("h1 connection"));
        }
    }
    let window = Window::new(s);
    let workers = senders
        .into_iter()
        .map(|mut sender| {
            let target = target.clone();
            let (warm_end, end) = (window.warm_end, window.end);
            tokio::spawn(async move {
                let mut out = WorkerOut::default();
                loop {
                    let t0 = Instant::now();
                    if t0 >= end {
                        break;
                    }
                    match sender.get(&target).await {
                        Ok(()) if t0 >= warm_end => {
                            out.latencies_ns.push(t0.elapsed().as_nanos() as u64)
                        }
                        Ok(()) => {}
                        Err(e) => {
                            out.error(e);
                            if sender.is_closed() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                out
            })
        })
        .collect();
    collect(route, &window, s.secs, workers).await
}

/// Paced load: `moderate_conns` keep-alive connections sharing `moderate_rate` requests/s,
/// staggered so they do not fire together. Latency is measured from the actual send.
async fn moderate(route: &Route, h2: bool, s: &Settings) -> (Sample, Option<String>) {
    let target = Target::new(route);
    let mut senders = Vec::new();
    for _ in 0..s.moderate_conns {
        senders.push(Sender::connect(route, h2).await.expect("connection"));
    }
    let interval = Duration::from_secs_f64(s.moderate_conns as f64 / s.moderate_rate as f64);
    let window = Window::new(s);
    let n = s.moderate_conns as u32;
    let workers = senders
        .into_iter()
        .enumerate()
        .map(|(i, mut sender)| {
            let target = target.clone();
            let (warm_end, end) = (window.warm_end, window.end);
            tokio::spawn(async move {
                let mut out = WorkerOut::default();
                let start = tokio::time::Instant::now() + interval * i as u32 / n;
                let mut tick = tokio::time::interval_at(start, interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tick.tick().await;
                    let t0 = Instant::now();
                    if t0 >= end {
                        break;
                    }
                    match sender.get(&target).await {
                        Ok(()) if t0 >= warm_end => {
                            out.latencies_ns.push(t0.elapsed().as_nanos() as u64)
                        }
                        Ok(()) => {}
                        Err(e) => {
                            out.error(e);
                            if sender.is_closed() {
                                break;
                            }
                        }
                    }
                }
                out
            })
        })
        .collect();
    collect(route, &window, s.secs, workers).await
}

/// Each request on a fresh TCP + TLS connection (through a fresh CONNECT when proxied),
/// HTTP/1.1, full handshakes. Latency is connect + handshake + one request.
async fn new_connections(route: &Arc<Route>, s: &Settings) -> (Sample, Option<String>) {
    let target = Target::new(route);
    let window = Window::new(s);
    let workers = (0..s.newconn_concurrency)
        .map(|_| {
            let target = target.clone();
            let route = route.clone();
            let (warm_end, end) = (window.warm_end, window.end);
            tokio::spawn(async move {
                let mut out = WorkerOut::default();
                loop {
                    let t0 = Instant::now();
                    if t0 >= end {
                        break;
                    }
                    let result = async {
                        let tls = open(&route, false).await?;
                        let (sender, conn) = http1::handshake(TokioIo::new(tls)).await?;
                        let conn = tokio::spawn(conn);
                        let mut sender = Sender::H1(sender);
                        sender.get(&target).await?;
                        let elapsed = t0.elapsed();
                        drop(sender);
                        let _ = conn.await;
                        Ok::<_, BoxError>(elapsed)
                    }
                    .await;
                    match result {
                        Ok(elapsed) if t0 >= warm_end => {
                            out.latencies_ns.push(elapsed.as_nanos() as u64)
                        }
                        Ok(_) => {}
                        Err(e) => {
                            out.error(e);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                out
            })
        })
        .collect();
    collect(route, &window, s.secs, workers).await
}

// ---------------------------------------------------------------------------------------
// Policy evaluation, in this process, with the bundled policies

struct PolicyFigures {
    build_p50: f64,
    build_p99: f64,
    eval_p50: f64,
    eval_p99: f64,
    connect_eval_p50: f64,
    connect_eval_p99: f64,
    deny_eval_p50: f64,
}

fn percentile_us(v: &mut [u64], p: usize) -> f64 {
    v.sort_unstable();
    v[(v.len() * p / 100).min(v.len() - 1)] as f64 / 1000.0
}

fn policy_bench(s: &Settings) -> PolicyFigures {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let engine = PolicyEngine::load(&dir).expect("bundled policies load");
    let identity = Identity::new(
        "bench",
        TOKEN.as_bytes().to_vec(),
        "bench",
        vec![HOST.to_string(), "*.example.com".into(), "pypi.org".into()],
        BTreeMap::from([("team".to_string(), "bench".to_string())]),
    );
    let sandbox = sandbox_value(&identity);
    let mut headers = HeaderMap::new();
    headers.insert(header::HOST, HeaderValue::from_static("origin.bench.test"));
    headers.insert(header::USER_AGENT, HeaderValue::from_static("curl/8.5.0"));
    headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("gzip, br"),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let ip = Some("127.0.0.1".parse().unwrap());
    let build = |host: &str, phase: &str| {
        let destination = destination_value(&Destination {
            host,
            port: 443,
            ip,
            scheme: "https",
        });
        let request = (phase == "request").then(|| {
            request_value(&RequestFacts {
                method: "GET",
                path: "/v1/items?page=2",
                headers: &headers,
            })
        });
        egress_input(phase, sandbox.clone(), destination, request)
    };
    let run = |host: &str, phase: &str, expect: bool, n: usize| {
        let mut build_ns = Vec::with_capacity(n);
        let mut eval_ns = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            let input = build(host, phase);
            let t1 = Instant::now();
            let decision = engine.evaluate("egress", input);
            let t2 = Instant::now();
            assert_eq!(decision.allowed, expect, "{host}: {:?}", decision.reasons);
            build_ns.push((t1 - t0).as_nanos() as u64);
            eval_ns.push((t2 - t1).as_nanos() as u64);
        }
        (build_ns, eval_ns)
    };
    // Warm up: the worker-local engine clone is made on the first evaluation.
    run(HOST, "request", true, 1000);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut reps: Vec<[f64; 7]> = Vec::new();
    for _ in 0..s.repeats {
        let (mut b, mut e) = run(HOST, "request", true, s.policy_iters);
        let (_, mut c) = run(HOST, "connect", true, s.policy_iters / 4);
        let (_, mut d) = run("evil.test", "connect", false, s.policy_iters / 4);
        reps.push([
            percentile_us(&mut b, 50),
            percentile_us(&mut b, 99),
            percentile_us(&mut e, 50),
            percentile_us(&mut e, 99),
            percentile_us(&mut c, 50),
            percentile_us(&mut c, 99),
            percentile_us(&mut d, 50),
        ]);
    }
    let m = |i: usize| median(reps.iter().map(|r| r[i]).collect());
    PolicyFigures {
        build_p50: m(0),
        build_p99: m(1),
        eval_p50: m(2),
        eval_p99: m(3),
        connect_eval_p50: m(4),
        connect_eval_p99: m(5),
        deny_eval_p50: m(6),
    }
}

// ---------------------------------------------------------------------------------------
// Reporting

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Scenario {
    KeepAliveH1,
    KeepAliveH2,
    NewConnections,
    ModerateH1,
    ModerateH2,
}

impl Scenario {
    fn label(self) -> &'static str {
        match self {
            Scenario::KeepAliveH1 => "keep-alive h1",
            Scenario::KeepAliveH2 => "keep-alive h2",
            Scenario::NewConnections => "new TLS conns",
            Scenario::ModerateH1 => "moderate h1",
            Scenario::ModerateH2 => "moderate h2",
        }
    }

    /// The name `SANDGATE_BENCH_SCENARIOS` selects it by.
    fn key(self) -> &'static str {
        match self {
            Scenario::KeepAliveH1 => "keepalive-h1",
            Scenario::KeepAliveH2 => "keepalive-h2",
            Scenario::NewConnections => "newconn",
            Scenario::ModerateH1 => "moderate-h1",
            Scenario::ModerateH2 => "moderate-h2",
        }
    }
}

fn median_sample(samples: &[Sample]) -> Sample {
    let med = |f: &dyn Fn(&Sample) -> f64| {
        let mut v: Vec<f64> = samples.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Sample {
        rate: med(&|s| s.rate),
        p50_us: med(&|s| s.p50_us),
        p99_us: med(&|s| s.p99_us),
        errors: samples.iter().map(|s| s.errors).sum(),
        proxy_cores: samples[0]
            .proxy_cores
            .map(|_| med(&|s| s.proxy_cores.unwrap_or(f64::NAN))),
        bench_cores: med(&|s| s.bench_cores),
    }
}

type Results = BTreeMap<(Scenario, &'static str), Vec<Sample>>;

fn get(results: &Results, scenario: Scenario, route: &str) -> Option<Sample> {
    results
        .iter()
        .find(|((sc, r), _)| *sc == scenario && *r == route)
        .map(|(_, v)| median_sample(v))
}

struct Row {
    metric: String,
    direct: String,
    sandgate: String,
    ratio: String,
    target: String,
    peers: Vec<String>,
}

fn fmt_rate(v: f64, unit: &str) -> String {
    format!("{v:.0} {unit}")
}

fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

fn print_table(rows: &[Row], peer_names: &[&str]) {
    let mut header = vec![
        "metric".to_string(),
        "direct".into(),
        "sandgate".into(),
        "ratio (sandgate/direct)".into(),
        "target".into(),
    ];
    header.extend(peer_names.iter().map(|p| format!("{p} (ratio)")));
    let cells: Vec<Vec<String>> = std::iter::once(header)
        .chain(rows.iter().map(|r| {
            let mut v = vec![
                r.metric.clone(),
                r.direct.clone(),
                r.sandgate.clone(),
                r.ratio.clone(),
                r.target.clone(),
            ];
            v.extend(r.peers.iter().cloned());
            v
        }))
        .collect();
    let cols = cells[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            cells
                .iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |row: &[String]| {
        let parts: Vec<String> = (0..cols)
            .map(|c| {
                let s = row.get(c).map(String::as_str).unwrap_or("");
                format!("{s:<w$}", w = widths[c])
            })
            .collect();
        println!("| {} |", parts.join(" | "));
    };
    line(&cells[0]);
    println!(
        "|{}|",
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|")
    );
    for row in &cells[1..] {
        line(row);
    }
}

// ---------------------------------------------------------------------------------------

fn main() {
    if let Ok(files) = std::env::var(ORIGIN_CHILD_ENV) {
        sandgate::tls::install_default_provider();
        return origin_child_main(&files);
    }
    // `cargo bench` passes `--bench`; there is nothing to filter.
    let mut settings = Settings::from_env();
    // With RUST_BACKTRACE set, every `anyhow::Error` captures a backtrace, and regorus builds
    // (and discards) errors on its evaluation path: policy evaluation then costs about twice
    // as much. Production units do not set it, so neither this process nor the sandgate child
    // inherits it unless SANDGATE_BENCH_KEEP_BACKTRACE=1. Done before any thread exists.
    let names = ["RUST_BACKTRACE", "RUST_LIB_BACKTRACE"];
    let set: Vec<String> = names
        .iter()
        .filter_map(|n| std::env::var(n).ok().map(|v| format!("{n}={v}")))
        .collect();
    settings.backtrace_note = if set.is_empty() {
        "RUST_BACKTRACE not set".into()
    } else if env_or("SANDGATE_BENCH_KEEP_BACKTRACE", 0u8) != 0 {
        format!("{} kept (SANDGATE_BENCH_KEEP_BACKTRACE=1)", set.join(" "))
    } else {
        for n in names {
            std::env::remove_var(n);
        }
        format!(
            "{} removed for this process and sandgate (SANDGATE_BENCH_KEEP_BACKTRACE=1 keeps it)",
            set.join(" ")
        )
    };
    sandgate::tls::install_default_provider();
    // Before the runtime exists, so that its workers inherit the affinity.
    settings.layout.confine_bench();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(settings));
}

async fn run(s: Settings) {
    // The bench's own workers: the cores it may use (fewer than the machine's when split).
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // SAFETY: sysconf has no preconditions.
    let machine = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    println!("sandgate egress benchmark");
    println!("machine: {machine} cores; layout {}", s.layout.describe());
    println!(
        "settings: {secs}s per run after {warm}s warm-up, median of {rep} interleaved repeats; \
         keep-alive h1 {c} conns; h2 {hc} conns x {hs} streams; new conns {nc} concurrent \
         (full TLS 1.3 handshakes, no resumption, h1, one request each); moderate load {mr} req/s over {mc} conns; \
         policy {pi} evaluations per repeat; origin body {BODY_BYTES} B; bench runtime = tokio multi-thread ({cores} workers)",
        secs = s.secs,
        warm = s.warmup,
        rep = s.repeats,
        c = s.conns,
        hc = s.h2_conns,
        hs = s.h2_streams,
        nc = s.newconn_concurrency,
        mr = s.moderate_rate,
        mc = s.moderate_conns,
        pi = s.policy_iters,
    );
    println!("{}", s.backtrace_note);
    println!("(env: SANDGATE_BENCH_SECS, _WARMUP_SECS, _REPEATS, _CONNS, _H2_CONNS, _H2_STREAMS, _NEWCONN_CONCURRENCY, _MODERATE_CONNS, _MODERATE_RATE, _POLICY_ITERS, _PEERS=0, _KEEP_BACKTRACE=1, _LAYOUT=split|shared, _ORIGIN=process|in-process, _SCENARIOS=keepalive-h1,keepalive-h2,newconn,moderate-h1,moderate-h2)");
    println!();

    // Policy first, while the machine is quiet.
    let policy = policy_bench(&s);

    let dir = tempfile::tempdir().unwrap();
    let origin_ca = Ca::new("sandgate bench origin CA");
    let origin_ca_path = dir.path().join("origin-ca.pem");
    std::fs::write(&origin_ca_path, &origin_ca.cert_pem).unwrap();
    let (origin, origin_process) = origin(s.origin, &origin_ca, dir.path()).await;
    let origin_authority = format!("{HOST}:{}", origin.port());
    if let Some(process) = &origin_process {
        let _ = ORIGIN_PID.set(process.pid());
    }

    let (sandgate, sandgate_addr, sandgate_ca) =
        start_sandgate(dir.path(), &origin_ca_path, &s.layout);
    use base64::Engine as _;
    let basic = |id: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{id}:{TOKEN}"))
        )
    };
    let auth = basic("bench");
    let mut routes: Vec<Arc<Route>> = vec![
        Arc::new(Route::new(
            "direct",
            origin,
            None,
            origin_ca.cert_pem.as_bytes(),
            true,
        )),
        Arc::new(Route::new(
            "sandgate",
            origin,
            Some(ProxyHop {
                addr: sandgate_addr,
                authority: origin_authority.clone(),
                auth: Some(auth),
                pid: sandgate.pid(),
            }),
            &sandgate_ca,
            true,
        )),
        // The same sandgate, but the policy says `tunnel` for this identity: the client's TLS
        // goes to the origin itself. What any intermediary hop costs the client and the
        // origin here, with the proxy doing next to nothing: the ceiling for the ratios.
        Arc::new(Route::new(
            TUNNEL_ROUTE,
            origin,
            Some(ProxyHop {
                addr: sandgate_addr,
                authority: origin_authority.clone(),
                auth: Some(basic("bench-tunnel")),
                pid: sandgate.pid(),
            }),
            origin_ca.cert_pem.as_bytes(),
            true,
        )),
    ];
    println!(
        "origin https://{origin_authority} (127.0.0.1), {}; sandgate pid {} proxy {sandgate_addr}",
        match &origin_process {
            Some(p) => format!(
                "its own process (pid {}) on the bench cores (SANDGATE_BENCH_ORIGIN=in-process puts it in the load generator's process)",
                p.pid()
            ),
            None => "in the load generator's process (SANDGATE_BENCH_ORIGIN=in-process)".into(),
        },
        sandgate.pid()
    );

    // Peers, measured with the same client code when installed.
    let mut guards = vec![sandgate];
    guards.extend(origin_process);
    // The ceiling route first, then the peers: each gets a column with its ratio to direct.
    let mut peer_names: Vec<&'static str> = vec![TUNNEL_ROUTE];
    let mut skipped: Vec<String> = Vec::new();
    if s.peers {
        match start_squid(dir.path(), &origin_ca_path, &s.layout) {
            Ok((guard, addr, ca)) => {
                routes.push(Arc::new(Route::new(
                    "squid",
                    origin,
                    Some(ProxyHop {
                        addr,
                        authority: origin_authority.clone(),
                        auth: None,
                        pid: guard.pid(),
                    }),
                    &ca,
                    false,
                )));
                println!(
                    "squid (ssl-bump, no proxy auth, h1 only) pid {} on {addr}",
                    guard.pid()
                );
                guards.push(guard);
                peer_names.push("squid");
            }
            Err(e) => skipped.push(format!("squid skipped: {e}")),
        }
        match start_mitmdump(dir.path(), &origin_ca_path, &s.layout) {
            Ok((guard, addr, ca)) => {
                // mitmproxy resolves with the system resolver, which does not know the
                // bench name: CONNECT to the address; SNI and Host still carry the name.
                routes.push(Arc::new(Route::new(
                    "mitmdump",
                    origin,
                    Some(ProxyHop {
                        addr,
                        authority: origin.to_string(),
                        auth: None,
                        pid: guard.pid(),
                    }),
                    &ca,
                    true,
                )));
                println!("mitmdump (no proxy auth) pid {} on {addr}", guard.pid());
                guards.push(guard);
                peer_names.push("mitmdump");
            }
            Err(e) => skipped.push(format!("mitmdump skipped: {e}")),
        }
    } else {
        skipped.push("peers skipped: SANDGATE_BENCH_PEERS=0".into());
    }
    for line in &skipped {
        println!("{line}");
    }

    // Sanity: one request per route and protocol; a peer that fails is dropped.
    let target_ok = |route: Arc<Route>, h2: bool| async move {
        let mut sender = Sender::connect(&route, h2).await?;
        sender.get(&Target::new(&route)).await
    };
    let mut usable = Vec::new();
    for route in routes {
        let mut ok = true;
        for h2 in [false, true] {
            if h2 && !route.h2 {
                continue;
            }
            if let Err(e) = target_ok(route.clone(), h2).await {
                assert!(
                    route.proxy.is_none() || route.name != "sandgate",
                    "sandgate sanity request failed (h2={h2}): {e}"
                );
                assert!(route.proxy.is_some(), "direct request failed: {e}");
                println!(
                    "{} skipped: sanity request failed (h2={h2}): {e}",
                    route.name
                );
                ok = false;
            }
        }
        if ok {
            usable.push(route);
        } else {
            peer_names.retain(|p| *p != route.name);
        }
    }
    let routes = usable;
    println!();

    let mut results: Results = BTreeMap::new();
    let all = [
        Scenario::KeepAliveH1,
        Scenario::KeepAliveH2,
        Scenario::NewConnections,
        Scenario::ModerateH1,
        Scenario::ModerateH2,
    ];
    let scenarios: Vec<Scenario> = match std::env::var("SANDGATE_BENCH_SCENARIOS") {
        Ok(list) => {
            let wanted: Vec<&str> = list.split(',').map(str::trim).collect();
            for w in &wanted {
                assert!(
                    all.iter().any(|s| s.key() == *w),
                    "SANDGATE_BENCH_SCENARIOS: unknown scenario {w:?}; known: {}",
                    all.map(Scenario::key).join(",")
                );
            }
            all.into_iter()
                .filter(|s| wanted.contains(&s.key()))
                .collect()
        }
        Err(_) => all.to_vec(),
    };
    for &scenario in &scenarios {
        for rep in 1..=s.repeats {
            for route in &routes {
                let h2 = matches!(scenario, Scenario::KeepAliveH2 | Scenario::ModerateH2);
                if h2 && !route.h2 {
                    continue;
                }
                let (sample, error) = match scenario {
                    Scenario::KeepAliveH1 => keepalive(route, false, &s).await,
                    Scenario::KeepAliveH2 => keepalive(route, true, &s).await,
                    Scenario::NewConnections => new_connections(route, &s).await,
                    Scenario::ModerateH1 => moderate(route, false, &s).await,
                    Scenario::ModerateH2 => moderate(route, true, &s).await,
                };
                let unit = if scenario == Scenario::NewConnections {
                    "conn/s"
                } else {
                    "req/s"
                };
                println!(
                    "  {:<14} run {rep}/{} {:<9} {:>8.0} {unit:<6} p50 {:>9} p99 {:>9}  proxy CPU {:>5}  bench CPU {:.2} cores{}",
                    scenario.label(),
                    s.repeats,
                    route.name,
                    sample.rate,
                    fmt_us(sample.p50_us),
                    fmt_us(sample.p99_us),
                    sample
                        .proxy_cores
                        .map_or("-".to_string(), |c| format!("{c:.2}")),
                    sample.bench_cores,
                    error.map_or(String::new(), |e| format!(
                        "  ERRORS {} (first: {e})",
                        sample.errors
                    )),
                );
                results
                    .entry((scenario, route.name))
                    .or_default()
                    .push(sample);
            }
        }
    }
    drop(guards);

    // ---- the table
    let peer = |scenario: Scenario, f: &dyn Fn(Sample, Sample) -> String| -> Vec<String> {
        peer_names
            .iter()
            .map(|p| {
                match (
                    get(&results, scenario, "direct"),
                    get(&results, scenario, p),
                ) {
                    (Some(d), Some(x)) => f(d, x),
                    _ => "n/a".into(),
                }
            })
            .collect()
    };
    let mut rows: Vec<Row> = Vec::new();
    let throughput =
        |scenario: Scenario, metric: &str, unit: &str, floor: f64, rows: &mut Vec<Row>| {
            let (Some(d), Some(g)) = (
                get(&results, scenario, "direct"),
                get(&results, scenario, "sandgate"),
            ) else {
                return; // not selected by SANDGATE_BENCH_SCENARIOS
            };
            let ratio = g.rate / d.rate;
            rows.push(Row {
                metric: metric.into(),
                direct: fmt_rate(d.rate, unit),
                sandgate: fmt_rate(g.rate, unit),
                ratio: format!("{ratio:.2}"),
                target: format!("≥ {floor:.2}× direct: {}", verdict(ratio >= floor)),
                peers: peer(scenario, &|d, x| {
                    format!("{} ({:.2})", fmt_rate(x.rate, unit), x.rate / d.rate)
                }),
            });
            for (name, f) in [
                ("p50", (|s: &Sample| s.p50_us) as fn(&Sample) -> f64),
                ("p99", |s: &Sample| s.p99_us),
            ] {
                rows.push(Row {
                    metric: format!("  {name} latency"),
                    direct: fmt_us(f(&d)),
                    sandgate: fmt_us(f(&g)),
                    ratio: format!("{:.2}", f(&g) / f(&d)),
                    target: String::new(),
                    peers: peer(scenario, &|d, x| {
                        format!("{} ({:.2})", fmt_us(f(&x)), f(&x) / f(&d))
                    }),
                });
            }
        };
    throughput(
        Scenario::KeepAliveH1,
        &format!("keep-alive h1 throughput ({} conns)", s.conns),
        "req/s",
        0.5,
        &mut rows,
    );
    throughput(
        Scenario::KeepAliveH2,
        &format!(
            "keep-alive h2 throughput ({}×{} streams)",
            s.h2_conns, s.h2_streams
        ),
        "req/s",
        0.5,
        &mut rows,
    );
    throughput(
        Scenario::NewConnections,
        &format!("new TLS connections ({} concurrent)", s.newconn_concurrency),
        "conn/s",
        0.45,
        &mut rows,
    );
    for scenario in [Scenario::ModerateH1, Scenario::ModerateH2] {
        let (Some(d), Some(g)) = (
            get(&results, scenario, "direct"),
            get(&results, scenario, "sandgate"),
        ) else {
            continue;
        };
        let proto = if scenario == Scenario::ModerateH1 {
            "h1"
        } else {
            "h2"
        };
        let head = format!(
            "moderate load {proto} ({} req/s, {} conns)",
            s.moderate_rate, s.moderate_conns
        );
        rows.push(Row {
            metric: format!("{head} p50"),
            direct: fmt_us(d.p50_us),
            sandgate: fmt_us(g.p50_us),
            ratio: format!("{:.2}", g.p50_us / d.p50_us),
            target: String::new(),
            peers: peer(scenario, &|d, x| {
                format!("{} ({:.2})", fmt_us(x.p50_us), x.p50_us / d.p50_us)
            }),
        });
        rows.push(Row {
            metric: format!("{head} p99"),
            direct: fmt_us(d.p99_us),
            sandgate: fmt_us(g.p99_us),
            ratio: format!("{:.2}", g.p99_us / d.p99_us),
            target: String::new(),
            peers: peer(scenario, &|d, x| {
                format!("{} ({:.2})", fmt_us(x.p99_us), x.p99_us / d.p99_us)
            }),
        });
        let added = g.p99_us - d.p99_us;
        rows.push(Row {
            metric: format!("  p99 added latency {proto} (p50 added)"),
            direct: "-".into(),
            sandgate: format!("{} ({})", fmt_us(added), fmt_us(g.p50_us - d.p50_us)),
            ratio: "-".into(),
            target: format!("< 1 ms: {}", verdict(added < 1000.0)),
            peers: peer(scenario, &|d, x| {
                format!(
                    "{} ({})",
                    fmt_us(x.p99_us - d.p99_us),
                    fmt_us(x.p50_us - d.p50_us)
                )
            }),
        });
    }
    let none = || vec!["-".to_string(); peer_names.len()];
    let us2 = |v: f64| format!("{v:.2} µs");
    rows.push(Row {
        metric: "policy eval per request, median (p99)".into(),
        direct: "-".into(),
        sandgate: format!("{} ({})", us2(policy.eval_p50), us2(policy.eval_p99)),
        ratio: "-".into(),
        target: format!("median < 10 µs: {}", verdict(policy.eval_p50 < 10.0)),
        peers: none(),
    });
    rows.push(Row {
        metric: "  input build alone (baseline), median (p99)".into(),
        direct: "-".into(),
        sandgate: format!("{} ({})", us2(policy.build_p50), us2(policy.build_p99)),
        ratio: "-".into(),
        target: String::new(),
        peers: none(),
    });
    rows.push(Row {
        metric: "  connect-phase eval allow, median (p99); deny median".into(),
        direct: "-".into(),
        sandgate: format!(
            "{} ({}); {}",
            us2(policy.connect_eval_p50),
            us2(policy.connect_eval_p99),
            us2(policy.deny_eval_p50)
        ),
        ratio: "-".into(),
        target: String::new(),
        peers: none(),
    });
    println!();
    print_table(&rows, &peer_names);

    println!();
    println!(
        "CPU during the measured windows (median of repeats; cores = CPU-seconds per second):"
    );
    for &scenario in &scenarios {
        for route in &routes {
            if let Some(x) = get(&results, scenario, route.name) {
                let per = |cores: f64| cores / x.rate * 1e6;
                let proxy = x.proxy_cores.map_or("-".into(), |c| {
                    format!("{c:.2} cores = {:.0} µs/op", per(c))
                });
                println!(
                    "  {:<14} {:<9} proxy {:<26} bench (client+origin) {:.2} cores = {:.0} µs/op  errors {}",
                    scenario.label(),
                    route.name,
                    proxy,
                    x.bench_cores,
                    per(x.bench_cores),
                    x.errors
                );
            }
        }
    }
    for line in &skipped {
        println!("{line}");
    }
}
