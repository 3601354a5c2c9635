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
    /// What `SANDGATE_BENCH_SCENARIOS` selected, in run order.
    scenarios: Vec<Scenario>,
    /// Seconds of load per proxy in the `soak` scenario.
    soak_secs: f64,
    /// Keep-alive connections of the `soak` scenario (the issue's `-c 64`).
    soak_conns: usize,
    /// The sandgate configurations the `soak` scenario runs, in order.
    soak_variants: Vec<SoakVariant>,
    /// Open tunnels at which the `idle-tunnels` scenario measures, ascending.
    tunnels: Vec<usize>,
    /// `idle-tunnels` variants: CONNECT + TLS only, and/or one request on each tunnel.
    tunnel_variants: Vec<TunnelVariant>,
    /// The sandgate binary every sandgate process runs.
    sandgate_bin: PathBuf,
    /// `SANDGATE_BENCH_BASELINE_BIN`: another sandgate build measured as one more route
    /// (`sandgate-baseline`) in the same run, so a change is judged against its baseline
    /// under the same machine conditions rather than against a run made minutes apart.
    baseline_bin: Option<PathBuf>,
    /// What was done about `RUST_BACKTRACE` (see `main`).
    backtrace_note: String,
    /// The descriptor limit the bench (and so every process it starts) runs with.
    nofile_note: String,
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
            scenarios: Scenario::from_env(),
            soak_secs: env_or("SANDGATE_BENCH_SOAK_SECS", 300.0f64).max(10.0),
            soak_conns: env_or("SANDGATE_BENCH_SOAK_CONNS", 64usize).max(1),
            soak_variants: SoakVariant::from_env(),
            tunnels: {
                let list =
                    std::env::var("SANDGATE_BENCH_TUNNELS").unwrap_or_else(|_| "1000,10000".into());
                let mut v: Vec<usize> = list
                    .split(',')
                    .map(|n| {
                        n.trim().parse().unwrap_or_else(|_| {
                            panic!(
                                "SANDGATE_BENCH_TUNNELS={list:?}: expected counts like 1000,10000"
                            )
                        })
                    })
                    .filter(|&n| n > 0)
                    .collect();
                v.sort_unstable();
                v.dedup();
                assert!(!v.is_empty(), "SANDGATE_BENCH_TUNNELS is empty");
                v
            },
            tunnel_variants: TunnelVariant::from_env(),
            sandgate_bin: std::env::var_os("SANDGATE_BENCH_SANDGATE_BIN").map_or_else(
                || PathBuf::from(env!("CARGO_BIN_EXE_sandgate")),
                PathBuf::from,
            ),
            baseline_bin: std::env::var_os("SANDGATE_BENCH_BASELINE_BIN").map(PathBuf::from),
            backtrace_note: String::new(),
            nofile_note: String::new(),
        }
    }

    fn max_tunnels(&self) -> usize {
        self.tunnels.last().copied().unwrap_or(0)
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

/// Raises this process's descriptor limit: the soft limit to the hard one, and as root both
/// to `want` when the hard limit is lower (within `fs.nr_open`). Children inherit it.
fn raise_nofile(want: u64) -> String {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes to the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return "descriptor limit unknown".into();
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(limit.rlim_max);
    let mut tries = Vec::new();
    if is_root() && limit.rlim_max < want {
        let to = want.min(nr_open);
        tries.push(libc::rlimit {
            rlim_cur: to,
            rlim_max: to,
        });
    }
    tries.push(libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    });
    for raised in tries {
        if raised.rlim_cur <= limit.rlim_cur && raised.rlim_max <= limit.rlim_max {
            break;
        }
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
            break;
        }
    }
    format!(
        "descriptor limit {} (hard {}) for this process and its children",
        limit.rlim_cur, limit.rlim_max
    )
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

/// Starts `bin` (`sandgate serve`) on a config written into `dir`; `proxy_extra` is added to
/// its `[proxy]` table (TOML lines).
fn start_sandgate(
    dir: &Path,
    origin_ca: &Path,
    layout: &Layout,
    bin: &Path,
    proxy_extra: &str,
) -> (ChildGuard, SocketAddr, Vec<u8>) {
    let started = start_sandgate_with(dir, origin_ca, layout, bin, proxy_extra, "off");
    (started.guard, started.proxy, started.ca_pem)
}

/// A sandgate process started by [`start_sandgate_with`].
struct StartedSandgate {
    guard: ChildGuard,
    proxy: SocketAddr,
    api: SocketAddr,
    ca_pem: Vec<u8>,
}

/// [`start_sandgate`] with its decision log sent to `decisions` (`off`, `stdout` or a file
/// path; stdout goes to /dev/null here), and the API address as well.
fn start_sandgate_with(
    dir: &Path,
    origin_ca: &Path,
    layout: &Layout,
    bin: &Path,
    proxy_extra: &str,
    decisions: &str,
) -> StartedSandgate {
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
{proxy_extra}
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
decisions = {decisions:?}
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
    let mut cmd = Command::new(bin);
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
                    let addr = |s: &str| s.split_whitespace().next().unwrap_or("").to_string();
                    let api = line.split("API on http://").nth(1).map(addr);
                    let _ = tx.send((addr(rest), api.unwrap_or_default()));
                    continue;
                }
            }
            // Warnings (the configured level) are worth seeing next to the figures.
            eprintln!("[sandgate] {line}");
        }
    });
    let (proxy, api) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("sandgate did not report its proxy address");
    let ca_pem = std::fs::read(ca_dir.join("ca.pem")).expect("sandgate CA");
    StartedSandgate {
        guard,
        proxy: proxy.parse().expect("proxy address"),
        api: api.trim_end_matches(',').parse().expect("API address"),
        ca_pem,
    }
}

/// Starts squid (ssl-bump) with its config in `dir`; `extra_conf` is appended to it.
fn start_squid(
    dir: &Path,
    origin_ca: &Path,
    layout: &Layout,
    extra_conf: &str,
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
{extra_conf}",
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
// Memory: a soak under keep-alive load, and idle intercepted tunnels (`soak`, `idle-tunnels`;
// run only when named in SANDGATE_BENCH_SCENARIOS). Each starts proxies of its own, so what
// they read is a fresh process's memory. The soak runs sandgate twice: once with nothing
// draining anything (decision log off, `/metrics` never scraped, so a recorder or queue that
// grows until someone reads it shows), once with the log written and `/metrics` scraped (so
// the writer's queue and the exposition's rendering are under load too).

/// How often the soak samples the proxy's memory.
const SOAK_EVERY: Duration = Duration::from_secs(10);
/// Tunnels opened at once by `idle-tunnels`.
const OPEN_CONCURRENCY: usize = 32;
/// Failed tunnel opens after which an `idle-tunnels` run stops where it is.
const MAX_OPEN_ERRORS: u64 = 50;

/// A process's resident memory, from `/proc/<pid>/status`, in KiB.
#[derive(Clone, Copy, Debug)]
struct Mem {
    /// `VmRSS`: every resident page (anonymous + file-backed + shared memory).
    rss: u64,
    /// `RssAnon`: the resident heap and stacks, which is what grows or is given back.
    anon: u64,
}

fn mem(pid: u32) -> Option<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(Mem {
        rss: field("VmRSS:")?,
        anon: field("RssAnon:")?,
    })
}

fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

fn fmt_mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn fmt_mem(m: Option<Mem>) -> String {
    m.map_or("-".into(), |m| {
        format!("{} (anon {})", fmt_mib(m.rss), fmt_mib(m.anon))
    })
}

/// A signed difference in KiB, as MiB.
fn fmt_delta_mib(kib: i64) -> String {
    format!("{:+.1} MiB", kib as f64 / 1024.0)
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A route through a proxy started by the memory scenarios (HTTP/1.1 only).
fn proxy_route(
    name: &'static str,
    origin: SocketAddr,
    addr: SocketAddr,
    pid: u32,
    auth: Option<String>,
    ca_pem: &[u8],
) -> Route {
    Route::new(
        name,
        origin,
        Some(ProxyHop {
            addr,
            authority: format!("{HOST}:{}", origin.port()),
            auth,
            pid,
        }),
        ca_pem,
        false,
    )
}

struct SoakPoint {
    secs: f64,
    requests: u64,
    mem: Option<Mem>,
}

struct SoakRun {
    points: Vec<SoakPoint>,
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    /// `SOAK_EVERY` after the load stopped and its connections closed.
    after: Option<Mem>,
    /// `/metrics` scrapes made during the run and the last one's size, when scraped.
    scrapes: Option<(u64, usize)>,
}

/// How often the `logged` soak variant scrapes sandgate's `/metrics` (Prometheus' default
/// interval is 15 s; 5 s scrapes more often than any real deployment would).
const SCRAPE_EVERY: Duration = Duration::from_secs(5);

/// One sandgate configuration the soak runs (`SANDGATE_BENCH_SOAK_VARIANTS`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum SoakVariant {
    /// Decision log off, `/metrics` never scraped: what grows per request with nothing
    /// draining it shows here.
    Quiet,
    /// Decision log to a file (one record per request) and `/metrics` scraped every
    /// [`SCRAPE_EVERY`]: the log writer's queue and the exposition's rendering under load.
    Logged,
}

impl SoakVariant {
    fn from_env() -> Vec<SoakVariant> {
        let list =
            std::env::var("SANDGATE_BENCH_SOAK_VARIANTS").unwrap_or_else(|_| "quiet,logged".into());
        list.split(',')
            .map(|v| match v.trim() {
                "quiet" => SoakVariant::Quiet,
                "logged" => SoakVariant::Logged,
                other => panic!(
                    "SANDGATE_BENCH_SOAK_VARIANTS: unknown variant {other:?} (expected quiet, logged)"
                ),
            })
            .collect()
    }

    fn route_name(self) -> &'static str {
        match self {
            SoakVariant::Quiet => "sandgate",
            SoakVariant::Logged => "sandgate+log",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            SoakVariant::Quiet => "decision log off, /metrics never scraped",
            SoakVariant::Logged => "decision log to a file, /metrics scraped every 5 s",
        }
    }
}

/// Scrapes `http://{api}/metrics` every [`SCRAPE_EVERY`] until `end`; returns the number of
/// scrapes and the size of the last exposition.
async fn scrape_until(api: SocketAddr, end: Instant) -> (u64, usize) {
    let (mut scrapes, mut last) = (0, 0);
    while Instant::now() + SCRAPE_EVERY < end {
        tokio::time::sleep(SCRAPE_EVERY).await;
        let Ok(mut conn) = TcpStream::connect(api).await else {
            continue;
        };
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\r\n");
        let mut body = Vec::new();
        if conn.write_all(req.as_bytes()).await.is_ok() && conn.read_to_end(&mut body).await.is_ok()
        {
            scrapes += 1;
            last = body.len();
        }
    }
    (scrapes, last)
}

/// The keep-alive h1 client (`s.soak_conns` connections, closed loop) for `s.soak_secs`, sampling
/// the proxy's memory every `SOAK_EVERY`; with `scrape`, `/metrics` is scraped meanwhile.
async fn soak_run(
    route: &Route,
    s: &Settings,
    scrape: Option<SocketAddr>,
) -> Result<SoakRun, BoxError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let pid = route.pid().expect("the soak runs through a proxy");
    let target = Target::new(route);
    let mut senders = Vec::new();
    for _ in 0..s.soak_conns {
        senders.push(Sender::connect(route, false).await?);
    }
    let requests = Arc::new(AtomicU64::new(0));
    let mut points = vec![SoakPoint {
        secs: 0.0,
        requests: 0,
        mem: mem(pid),
    }];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(s.soak_secs);
    let scraper = scrape.map(|api| tokio::spawn(scrape_until(api, end)));
    let workers: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            let target = target.clone();
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut out = WorkerOut::default();
                while Instant::now() < end {
                    match sender.get(&target).await {
                        Ok(()) => {
                            requests.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            out.error(e);
                            if sender.is_closed() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                out // the connection closes with its sender, here
            })
        })
        .collect();
    for k in 1.. {
        let at = (start + SOAK_EVERY * k).min(end);
        tokio::time::sleep_until(at.into()).await;
        let point = SoakPoint {
            secs: (at - start).as_secs_f64(),
            requests: requests.load(Ordering::Relaxed),
            mem: mem(pid),
        };
        println!(
            "  soak {:<12} t {:>4.0} s {:>12} requests  RSS {}",
            route.name,
            point.secs,
            thousands(point.requests),
            fmt_mem(point.mem)
        );
        points.push(point);
        if at >= end {
            break;
        }
    }
    let (mut errors, mut first_error) = (0, None);
    for w in workers {
        let out = w.await.expect("soak worker panicked");
        errors += out.errors;
        first_error = first_error.or(out.first_error);
    }
    let scrapes = match scraper {
        Some(task) => Some(task.await.expect("scraper panicked")),
        None => None,
    };
    tokio::time::sleep(SOAK_EVERY).await;
    let after = mem(pid);
    println!(
        "  soak {:<12} {}s after the load stopped (connections closed): RSS {}",
        route.name,
        SOAK_EVERY.as_secs(),
        fmt_mem(after)
    );
    Ok(SoakRun {
        points,
        requests: requests.load(Ordering::Relaxed),
        errors,
        first_error,
        after,
        scrapes,
    })
}

/// `soak`: sandgate in each [`SoakVariant`], then squid, each fresh and alone on the proxy
/// cores, under the same keep-alive h1 load; one table of their memory every `SOAK_EVERY`.
async fn soak(s: &Settings, origin: SocketAddr, origin_ca: &Path) {
    println!();
    println!(
        "soak: keep-alive h1 ({} conns, closed loop) for {:.0} s per proxy, RSS every {} s \
         (/proc/<pid>/status VmRSS, RssAnon); sandgate variants: {}",
        s.soak_conns,
        s.soak_secs,
        SOAK_EVERY.as_secs(),
        s.soak_variants
            .iter()
            .map(|v| format!("{} ({})", v.route_name(), v.describe()))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let mut runs: Vec<(&'static str, SoakRun)> = Vec::new();
    for &variant in &s.soak_variants {
        runs.push((
            variant.route_name(),
            soak_sandgate(s, variant, origin, origin_ca).await,
        ));
    }
    if s.peers {
        let dir = tempfile::tempdir().unwrap();
        match start_squid(dir.path(), origin_ca, &s.layout, "") {
            Ok((guard, addr, ca)) => {
                let route = proxy_route("squid", origin, addr, guard.pid(), None, &ca);
                println!("squid pid {} (ssl-bump; its main process)", guard.pid());
                match soak_run(&route, s, None).await {
                    Ok(run) => runs.push(("squid", run)),
                    Err(e) => println!("squid skipped: {e}"),
                }
            }
            Err(e) => println!("squid skipped: {e}"),
        }
    } else {
        println!("squid skipped: SANDGATE_BENCH_PEERS=0");
    }
    println!();
    print_soak_table(&runs);
    println!();
    for (name, run) in &runs {
        print_soak_summary(name, run, s);
    }
}

/// One soak through a fresh sandgate process configured as `variant`.
async fn soak_sandgate(
    s: &Settings,
    variant: SoakVariant,
    origin: SocketAddr,
    origin_ca: &Path,
) -> SoakRun {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.jsonl");
    let decisions = match variant {
        SoakVariant::Quiet => "off".to_string(),
        SoakVariant::Logged => log.display().to_string(),
    };
    let sg = start_sandgate_with(
        dir.path(),
        origin_ca,
        &s.layout,
        &s.sandgate_bin,
        "",
        &decisions,
    );
    let name = variant.route_name();
    let route = proxy_route(
        name,
        origin,
        sg.proxy,
        sg.guard.pid(),
        Some(basic("bench")),
        &sg.ca_pem,
    );
    println!(
        "{name} pid {} ({}; {})",
        sg.guard.pid(),
        s.sandgate_bin.display(),
        variant.describe()
    );
    let scrape = (variant == SoakVariant::Logged).then_some(sg.api);
    let run = soak_run(&route, s, scrape)
        .await
        .expect("soak through sandgate");
    if variant == SoakVariant::Logged {
        let lines = std::fs::read(&log).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
        println!(
            "{name}: {} decision records written",
            thousands(lines as u64)
        );
    }
    run
}

fn print_soak_table(runs: &[(&'static str, SoakRun)]) {
    let mut header = vec!["t".to_string()];
    for (name, _) in runs {
        header.push(format!("{name} requests"));
        header.push(format!("{name} RSS (anon)"));
    }
    let mut cells = vec![header];
    let rows = runs.iter().map(|(_, r)| r.points.len()).max().unwrap_or(0);
    for i in 0..rows {
        let secs = runs
            .iter()
            .find_map(|(_, r)| r.points.get(i).map(|p| p.secs));
        let mut row = vec![secs.map_or("-".into(), |t| format!("{t:.0} s"))];
        for (_, run) in runs {
            match run.points.get(i) {
                Some(p) => {
                    row.push(thousands(p.requests));
                    row.push(fmt_mem(p.mem));
                }
                None => row.extend(["-".to_string(), "-".to_string()]),
            }
        }
        cells.push(row);
    }
    let mut after = vec![format!("+{} s idle", SOAK_EVERY.as_secs())];
    for (_, run) in runs {
        after.push("(closed)".into());
        after.push(fmt_mem(run.after));
    }
    cells.push(after);
    print_grid(&cells);
}

/// The least-squares slope of `points` (x, y).
fn ls_slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx > 0.0 {
        sxy / sxx
    } else {
        f64::NAN
    }
}

/// The soak's verdict for one proxy: growth per request, and the RSS slope in MiB per minute
/// after the first minute (the issue's target: below 1 MiB/min).
fn print_soak_summary(name: &str, run: &SoakRun, s: &Settings) {
    let rss = |p: &SoakPoint| p.mem.map_or(0, |m| m.rss) as i64;
    let (first, last) = (&run.points[0], &run.points[run.points.len() - 1]);
    // From the first sample under load: the warm-up (buffers, pools, caches) excluded.
    let warm = run.points.get(1).unwrap_or(first);
    let per_request = |from: &SoakPoint| {
        let n = run.requests.saturating_sub(from.requests).max(1);
        (rss(last) - rss(from)) as f64 * 1024.0 / n as f64
    };
    // Least squares from the first sample under load on: a steady leak shows as a steady
    // slope, the sawtooth of freeing and reuse does not.
    let by_request: Vec<(f64, f64)> = run.points[1..]
        .iter()
        .map(|p| (p.requests as f64, rss(p) as f64 * 1024.0))
        .collect();
    let after_minute: Vec<(f64, f64)> = run
        .points
        .iter()
        .filter(|p| p.secs >= 60.0)
        .map(|p| (p.secs / 60.0, rss(p) as f64 / 1024.0))
        .collect();
    let per_minute = if after_minute.len() >= 2 {
        format!("{:+.2} MiB/min", ls_slope(&after_minute))
    } else {
        "- (run under 70 s)".into()
    };
    let scrapes = run.scrapes.map_or(String::new(), |(n, bytes)| {
        format!("; /metrics scraped {n} times (last {} KiB)", bytes / 1024)
    });
    println!(
        "  {name:<12} {} requests ({:.0} req/s), errors {}{}; RSS start {} end {}: growth {} = {:.1} B/request; \
         from t={:.0} s: {} = {:.2} B/request, trend {:.2} B/request; \
         slope after the first minute (least squares) {per_minute}; {} s after the load: {}{scrapes}",
        thousands(run.requests),
        run.requests as f64 / s.soak_secs,
        run.errors,
        run.first_error
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})")),
        fmt_mib(rss(first) as u64),
        fmt_mib(rss(last) as u64),
        fmt_delta_mib(rss(last) - rss(first)),
        per_request(first),
        warm.secs,
        fmt_delta_mib(rss(last) - rss(warm)),
        per_request(warm),
        ls_slope(&by_request),
        SOAK_EVERY.as_secs(),
        fmt_mem(run.after),
    );
}

/// What each `idle-tunnels` tunnel carries before it is left idle.
#[derive(Clone, Copy, Debug, PartialEq)]
enum TunnelVariant {
    /// `CONNECT` + TLS handshake with the proxy's minted leaf, nothing more.
    Handshake,
    /// The same, then one HTTP/1.1 request (so the proxy's upstream side exists too).
    Request,
    /// `CONNECT` + TLS negotiating h2, then one request: an h2 connection keeps its state
    /// (HPACK tables, settings, stream bookkeeping) while idle, so it cannot park like h1.
    /// sandgate only: squid speaks HTTP/1.1 to clients when it bumps.
    H2Request,
}

impl TunnelVariant {
    fn from_env() -> Vec<TunnelVariant> {
        let list = std::env::var("SANDGATE_BENCH_TUNNEL_VARIANTS")
            .unwrap_or_else(|_| "handshake,request,h2-request".into());
        list.split(',')
            .map(|v| match v.trim() {
                "handshake" => TunnelVariant::Handshake,
                "request" => TunnelVariant::Request,
                "h2-request" => TunnelVariant::H2Request,
                other => panic!(
                    "SANDGATE_BENCH_TUNNEL_VARIANTS: unknown variant {other:?}; known: handshake,request,h2-request"
                ),
            })
            .collect()
    }

    fn label(self) -> &'static str {
        match self {
            TunnelVariant::Handshake => "CONNECT+TLS",
            TunnelVariant::Request => "CONNECT+TLS+1 request",
            TunnelVariant::H2Request => "CONNECT+TLS(h2)+1 request",
        }
    }
}

/// An open tunnel, held by the client and left idle (dropping it closes the tunnel).
type Held = Box<dyn std::any::Any + Send>;

async fn open_held(route: Arc<Route>, variant: TunnelVariant) -> Result<Held, BoxError> {
    // A proxy out of descriptors leaves connections in its backlog, never answered.
    tokio::time::timeout(Duration::from_secs(30), open_held_now(route, variant))
        .await
        .map_err(|_| "no answer within 30 s")?
}

async fn open_held_now(route: Arc<Route>, variant: TunnelVariant) -> Result<Held, BoxError> {
    match variant {
        TunnelVariant::Handshake => Ok(Box::new(open(&route, false).await?)),
        TunnelVariant::Request | TunnelVariant::H2Request => {
            let h2 = variant == TunnelVariant::H2Request;
            let mut sender = Sender::connect(&route, h2).await?;
            sender.get(&Target::new(&route)).await?;
            Ok(Box::new(sender))
        }
    }
}

struct Stage {
    label: String,
    tunnels: usize,
    fds: Option<usize>,
    mem: Option<Mem>,
}

impl Stage {
    fn take(label: impl Into<String>, tunnels: usize, pid: u32) -> Stage {
        let stage = Stage {
            label: label.into(),
            tunnels,
            fds: open_fds(pid),
            mem: mem(pid),
        };
        println!(
            "    {:<34} tunnels {:>6}  fds {:>6}  RSS {}",
            stage.label,
            stage.tunnels,
            stage.fds.map_or("-".into(), |f| f.to_string()),
            fmt_mem(stage.mem)
        );
        stage
    }
}

/// Opens tunnels up to each of `checkpoints`, measuring the proxy at each, then closes them
/// all and measures what is left: at once, a while later, and after a little new traffic.
async fn idle_run(route: &Arc<Route>, variant: TunnelVariant, checkpoints: &[usize]) -> Vec<Stage> {
    let pid = route.pid().expect("idle tunnels go through a proxy");
    // Idle means settled: a sandgate tunnel parks 0.5–1 s after its last byte (`egress::park`)
    // and the pages it freed go back to the OS a second or two later (mimalloc purges pages
    // free for 1 s; sandgate collects every second). Every proxy gets the same wait.
    let settle = Duration::from_secs(5);
    // Warm-up: the leaf is minted and cached, the upstream pool exists, the workers have run.
    match open_held(route.clone(), TunnelVariant::Request).await {
        Ok(held) => drop(held),
        Err(e) => {
            println!("    {} skipped: warm-up tunnel failed: {e}", route.name);
            return Vec::new();
        }
    }
    tokio::time::sleep(settle).await;
    let mut stages = vec![Stage::take("before (after one warm-up tunnel)", 0, pid)];
    let before_fds = stages[0].fds.unwrap_or(0);
    let mut held: Vec<Held> = Vec::with_capacity(checkpoints.last().copied().unwrap_or(0));
    let (mut errors, mut first_error) = (0u64, None::<String>);
    let started = Instant::now();
    'checkpoints: for &goal in checkpoints {
        while held.len() < goal {
            let mut batch = tokio::task::JoinSet::new();
            for _ in 0..OPEN_CONCURRENCY.min(goal - held.len()) {
                batch.spawn(open_held(route.clone(), variant));
            }
            while let Some(result) = batch.join_next().await {
                match result.expect("open task panicked") {
                    Ok(h) => held.push(h),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            if errors >= MAX_OPEN_ERRORS {
                println!(
                    "    stopped at {} tunnels: {errors} opens failed (first: {})",
                    held.len(),
                    first_error.as_deref().unwrap_or("")
                );
                break 'checkpoints;
            }
        }
        tokio::time::sleep(settle).await;
        stages.push(Stage::take(
            format!(
                "{goal} open, idle ({:.0} s in)",
                started.elapsed().as_secs_f64()
            ),
            held.len(),
            pid,
        ));
    }
    if errors > 0 {
        println!(
            "    {errors} tunnel opens failed (first: {})",
            first_error.unwrap_or_default()
        );
    }
    drop(held);
    // The proxy has closed its side once its descriptors are back near where they were.
    let closed = Instant::now();
    while open_fds(pid).is_some_and(|n| n > before_fds + 64) && closed.elapsed().as_secs() < 30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stages.push(Stage::take(
        format!(
            "all closed, +{:.0} s",
            closed.elapsed().as_secs_f64().round()
        ),
        0,
        pid,
    ));
    tokio::time::sleep_until((closed + Duration::from_secs(10)).into()).await;
    stages.push(Stage::take("all closed, +10 s", 0, pid));
    // New traffic after the close: memory an allocator frees lazily, on its next calls, goes
    // back here; what is still held after this is kept for good.
    let target = Target::new(route);
    if let Ok(mut sender) = Sender::connect(route, false).await {
        for _ in 0..200 {
            if sender.get(&target).await.is_err() {
                break;
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stages.push(Stage::take("then 200 requests on 1 new tunnel", 0, pid));
    stages
}

/// `idle-tunnels`: for each variant, a fresh sandgate (and squid), N idle intercepted tunnels.
async fn idle_tunnels(s: &Settings, origin: SocketAddr, origin_ca: &Path) {
    println!();
    let limit = s.max_tunnels() + 1024;
    println!(
        "idle-tunnels: {} intercepted tunnels held idle ({} opened at once), variants {}; a fresh \
         proxy per variant; sandgate with [proxy] max_tunnels_per_identity = {limit} (max_connections one more), \
         header_read_timeout_secs = idle_timeout_secs = 3600 (the defaults, 10 s and 300 s, would close idle tunnels)",
        s.tunnels
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", then "),
        OPEN_CONCURRENCY,
        s.tunnel_variants
            .iter()
            .map(|v| v.label())
            .collect::<Vec<_>>()
            .join(" / ")
    );
    // One sandbox holds every tunnel here, and its share must stay below the cap.
    let sandgate_extra = format!(
        "max_connections = {}\nmax_tunnels_per_identity = {limit}\n\
         header_read_timeout_secs = 3600\nidle_timeout_secs = 3600",
        limit + 1
    );
    let squid_extra = format!(
        "max_filedescriptors {}\nclient_idle_pconn_timeout 60 minutes\nrequest_start_timeout 60 minutes\n\
         pconn_timeout 60 minutes\nread_timeout 60 minutes\n",
        4 * limit + 4096
    );
    // A bumped squid connection holds two descriptors (client and server side), and squid
    // stops accepting when it has none left: its tunnels are capped to what the limit allows.
    let nofile = {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes to the struct we own.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) };
        l.rlim_cur as usize
    };
    let squid_cap = nofile.saturating_sub(512) / 2;
    let mut squid_tunnels: Vec<usize> = s
        .tunnels
        .iter()
        .copied()
        .filter(|&n| n <= squid_cap)
        .collect();
    if squid_tunnels.len() < s.tunnels.len() {
        squid_tunnels.push(squid_cap);
        if s.peers {
            println!(
                "  squid capped at {squid_cap} tunnels: two descriptors each under a limit of {nofile} \
                 (the hard limit here; raising it needs CAP_SYS_RESOURCE)"
            );
        }
    }
    let mut results: Vec<(&'static str, TunnelVariant, Vec<Stage>)> = Vec::new();
    for &variant in &s.tunnel_variants {
        let dir = tempfile::tempdir().unwrap();
        let (guard, addr, ca) = start_sandgate(
            dir.path(),
            origin_ca,
            &s.layout,
            &s.sandgate_bin,
            &sandgate_extra,
        );
        println!(
            "  sandgate pid {} ({}), {}",
            guard.pid(),
            s.sandgate_bin.display(),
            variant.label()
        );
        let route = Arc::new(proxy_route(
            "sandgate",
            origin,
            addr,
            guard.pid(),
            Some(basic("bench")),
            &ca,
        ));
        results.push((
            "sandgate",
            variant,
            idle_run(&route, variant, &s.tunnels).await,
        ));
        drop(guard);
        if !s.peers || variant == TunnelVariant::H2Request {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        match start_squid(dir.path(), origin_ca, &s.layout, &squid_extra) {
            Ok((guard, addr, ca)) => {
                println!(
                    "  squid pid {} (ssl-bump), {}",
                    guard.pid(),
                    variant.label()
                );
                let route = Arc::new(proxy_route("squid", origin, addr, guard.pid(), None, &ca));
                results.push((
                    "squid",
                    variant,
                    idle_run(&route, variant, &squid_tunnels).await,
                ));
            }
            Err(e) => println!("  squid skipped: {e}"),
        }
    }

    println!();
    let mut cells = vec![[
        "proxy",
        "tunnels carry",
        "stage",
        "open",
        "proxy fds",
        "RSS (anon)",
        "Δ RSS from before",
        "per tunnel",
    ]
    .map(String::from)
    .to_vec()];
    for (name, variant, stages) in &results {
        let Some(before) = stages.first().and_then(|st| st.mem) else {
            continue;
        };
        let peak = stages
            .iter()
            .filter_map(|st| st.mem.map(|m| m.rss))
            .max()
            .unwrap_or(before.rss);
        for st in stages {
            let delta = st.mem.map(|m| m.rss as i64 - before.rss as i64);
            let per = match (delta, st.tunnels) {
                (Some(d), n) if n > 0 => format!("{:.1} KiB", d as f64 / n as f64),
                (Some(d), 0)
                    if st.label.starts_with("all closed") || st.label.starts_with("then") =>
                {
                    let grown = peak as i64 - before.rss as i64;
                    if grown > 0 {
                        format!("{:.0}% of the growth kept", 100.0 * d as f64 / grown as f64)
                    } else {
                        "-".into()
                    }
                }
                _ => "-".into(),
            };
            cells.push(vec![
                name.to_string(),
                variant.label().into(),
                st.label.clone(),
                st.tunnels.to_string(),
                st.fds.map_or("-".into(), |f| f.to_string()),
                fmt_mem(st.mem),
                delta.map_or("-".into(), fmt_delta_mib),
                per,
            ]);
        }
    }
    print_grid(&cells);
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
    let ips: [std::net::IpAddr; 1] = ["127.0.0.1".parse().unwrap()];
    let build = |host: &str, phase: &str| {
        let destination = destination_value(&Destination {
            host,
            port: 443,
            ips: &ips,
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
            let decision = engine.decide(sandgate::policy::Layer::Egress, input);
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
    /// Memory under minutes of keep-alive load (not run by default).
    Soak,
    /// Memory per idle intercepted tunnel, and after they close (not run by default).
    IdleTunnels,
}

impl Scenario {
    /// What a run without `SANDGATE_BENCH_SCENARIOS` measures: the table's rows.
    const STANDARD: [Scenario; 5] = [
        Scenario::KeepAliveH1,
        Scenario::KeepAliveH2,
        Scenario::NewConnections,
        Scenario::ModerateH1,
        Scenario::ModerateH2,
    ];
    /// Memory scenarios, run only when named: minutes each, and their own proxies.
    const EXTRA: [Scenario; 2] = [Scenario::Soak, Scenario::IdleTunnels];

    fn from_env() -> Vec<Scenario> {
        let known = || Scenario::STANDARD.iter().chain(&Scenario::EXTRA).copied();
        let Ok(list) = std::env::var("SANDGATE_BENCH_SCENARIOS") else {
            return Scenario::STANDARD.to_vec();
        };
        let wanted: Vec<&str> = list.split(',').map(str::trim).collect();
        for w in &wanted {
            assert!(
                known().any(|s| s.key() == *w),
                "SANDGATE_BENCH_SCENARIOS: unknown scenario {w:?}; known: {}",
                known().map(Scenario::key).collect::<Vec<_>>().join(",")
            );
        }
        known().filter(|s| wanted.contains(&s.key())).collect()
    }

    fn is_standard(self) -> bool {
        Scenario::STANDARD.contains(&self)
    }

    fn label(self) -> &'static str {
        match self {
            Scenario::KeepAliveH1 => "keep-alive h1",
            Scenario::KeepAliveH2 => "keep-alive h2",
            Scenario::NewConnections => "new TLS conns",
            Scenario::ModerateH1 => "moderate h1",
            Scenario::ModerateH2 => "moderate h2",
            Scenario::Soak => "soak",
            Scenario::IdleTunnels => "idle tunnels",
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
            Scenario::Soak => "soak",
            Scenario::IdleTunnels => "idle-tunnels",
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
    print_grid(&cells);
}

/// A markdown table; the first row is the header.
fn print_grid(cells: &[Vec<String>]) {
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
    // Before any child exists, so that sandgate, the origin and the peers inherit it: with
    // idle-tunnels each of them holds one or two descriptors per tunnel.
    let want = if settings.scenarios.contains(&Scenario::IdleTunnels) {
        (4 * settings.max_tunnels() as u64 + 8192).max(65_536)
    } else {
        0
    };
    settings.nofile_note = raise_nofile(want);
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
    println!("{}; {}", s.backtrace_note, s.nofile_note);
    println!("(env: SANDGATE_BENCH_SECS, _WARMUP_SECS, _REPEATS, _CONNS, _H2_CONNS, _H2_STREAMS, _NEWCONN_CONCURRENCY, _MODERATE_CONNS, _MODERATE_RATE, _POLICY_ITERS, _PEERS=0, _KEEP_BACKTRACE=1, _LAYOUT=split|shared, _ORIGIN=process|in-process, _SANDGATE_BIN, _BASELINE_BIN, _SCENARIOS=keepalive-h1,keepalive-h2,newconn,moderate-h1,moderate-h2 [+ soak, idle-tunnels: _SOAK_SECS, _TUNNELS, _TUNNEL_VARIANTS])");
    let standard: Vec<Scenario> = s
        .scenarios
        .iter()
        .copied()
        .filter(|sc| sc.is_standard())
        .collect();
    println!(
        "scenarios: {}",
        s.scenarios
            .iter()
            .map(|sc| sc.key())
            .collect::<Vec<_>>()
            .join(",")
    );
    println!();

    // Policy first, while the machine is quiet.
    let policy = (!standard.is_empty()).then(|| policy_bench(&s));

    let dir = tempfile::tempdir().unwrap();
    let origin_ca = Ca::new("sandgate bench origin CA");
    let origin_ca_path = dir.path().join("origin-ca.pem");
    std::fs::write(&origin_ca_path, &origin_ca.cert_pem).unwrap();
    let (origin, origin_process) = origin(s.origin, &origin_ca, dir.path()).await;
    if let Some(process) = &origin_process {
        let _ = ORIGIN_PID.set(process.pid());
    }
    println!(
        "origin https://{HOST}:{} (127.0.0.1), {}",
        origin.port(),
        match &origin_process {
            Some(p) => format!(
                "its own process (pid {}) on the bench cores (SANDGATE_BENCH_ORIGIN=in-process puts it in the load generator's process)",
                p.pid()
            ),
            None => "in the load generator's process (SANDGATE_BENCH_ORIGIN=in-process)".into(),
        },
    );

    if let Some(policy) = policy {
        standard_scenarios(&s, &standard, &policy, origin, &origin_ca, dir.path()).await;
    }
    let origin_ca_path = origin_ca_path.as_path();
    if s.scenarios.contains(&Scenario::Soak) {
        soak(&s, origin, origin_ca_path).await;
    }
    if s.scenarios.contains(&Scenario::IdleTunnels) {
        idle_tunnels(&s, origin, origin_ca_path).await;
    }
    drop(origin_process);
}

fn basic(id: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{id}:{TOKEN}"))
    )
}

/// The table's scenarios (the default run): every route against one sandgate and the peers.
async fn standard_scenarios(
    s: &Settings,
    scenarios: &[Scenario],
    policy: &PolicyFigures,
    origin: SocketAddr,
    origin_ca: &Ca,
    dir: &Path,
) {
    let origin_authority = format!("{HOST}:{}", origin.port());
    let origin_ca_path = dir.join("origin-ca.pem");
    let (sandgate, sandgate_addr, sandgate_ca) =
        start_sandgate(dir, &origin_ca_path, &s.layout, &s.sandgate_bin, "");
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
    println!("sandgate pid {} proxy {sandgate_addr}", sandgate.pid());

    // Peers, measured with the same client code when installed.
    let mut guards = vec![sandgate];
    // The ceiling route first, then the peers: each gets a column with its ratio to direct.
    let mut peer_names: Vec<&'static str> = vec![TUNNEL_ROUTE];
    if let Some(bin) = &s.baseline_bin {
        let base_dir = dir.join("baseline");
        std::fs::create_dir_all(&base_dir).unwrap();
        let (guard, addr, ca) = start_sandgate(&base_dir, &origin_ca_path, &s.layout, bin, "");
        routes.push(Arc::new(Route::new(
            "sandgate-baseline",
            origin,
            Some(ProxyHop {
                addr,
                authority: origin_authority.clone(),
                auth: Some(basic("bench")),
                pid: guard.pid(),
            }),
            &ca,
            true,
        )));
        println!(
            "sandgate-baseline ({}) pid {} proxy {addr}",
            bin.display(),
            guard.pid()
        );
        guards.push(guard);
        peer_names.push("sandgate-baseline");
    }
    let mut skipped: Vec<String> = Vec::new();
    if s.peers {
        match start_squid(dir, &origin_ca_path, &s.layout, "") {
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
        match start_mitmdump(dir, &origin_ca_path, &s.layout) {
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
    for &scenario in scenarios {
        for rep in 1..=s.repeats {
            for route in &routes {
                let h2 = matches!(scenario, Scenario::KeepAliveH2 | Scenario::ModerateH2);
                if h2 && !route.h2 {
                    continue;
                }
                let (sample, error) = match scenario {
                    Scenario::KeepAliveH1 => keepalive(route, false, s).await,
                    Scenario::KeepAliveH2 => keepalive(route, true, s).await,
                    Scenario::NewConnections => new_connections(route, s).await,
                    Scenario::ModerateH1 => moderate(route, false, s).await,
                    Scenario::ModerateH2 => moderate(route, true, s).await,
                    Scenario::Soak | Scenario::IdleTunnels => {
                        unreachable!("memory scenarios run on their own proxies")
                    }
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
    for &scenario in scenarios {
        for route in &routes {
            if let Some(x) = get(&results, scenario, route.name) {
                let per = |cores: f64| cores / x.rate * 1e6;
                let proxy = x.proxy_cores.map_or("-".into(), |c| {
                    format!("{c:.2} cores = {:.1} µs/op", per(c))
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
