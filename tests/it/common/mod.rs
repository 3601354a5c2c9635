//! Shared fixtures for integration tests: a test CA and HTTPS/HTTP/TCP origins on real
//! sockets, and an in-process gateway configured to reach them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use sandgate::config::Config;
use sandgate::server::Server;

pub const TOKEN: &str = "tok-0123456789abcdef";

/// The one place that decides whether tests needing root can run here (local sandboxes use
/// network, PID and mount namespaces and cgroups): `None` when they can, else why not.
/// `.ci/run` runs the suite as root, so CI runs them; elsewhere they print a skip line
/// (and under CI, see [`root_or_skip`], they fail instead).
pub fn unprivileged() -> Option<&'static str> {
    static REASON: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *REASON.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            Some("not running as root")
        } else if !Path::new("/run").exists() || which("ip").is_none() {
            Some("iproute2 (`ip netns`) is not available")
        } else {
            None
        }
    })
}

/// `true` when a root-only test can run; otherwise prints why it is skipped and returns
/// `false`. Under CI (`CI` set to anything but empty, `0` or `false`, as CI systems and
/// `.ci/run` set it) a test that cannot run panics instead: a green CI run must mean the
/// root-only tests ran, not that they were skipped.
pub fn root_or_skip(test: &str) -> bool {
    match skip_verdict(test, unprivileged(), in_ci()) {
        Ok(run) => run,
        Err(message) => panic!("{message}"),
    }
}

/// What [`root_or_skip`] does: `Ok(true)` run, `Ok(false)` skipped (with the line printed),
/// `Err` when CI would otherwise skip it.
pub fn skip_verdict(test: &str, unprivileged: Option<&str>, ci: bool) -> Result<bool, String> {
    match unprivileged {
        None => Ok(true),
        Some(reason) if ci => Err(format!(
            "{test} needs root and network namespaces ({reason}), and CI must not skip it: \
             run the suite as root with iproute2 installed (.ci/run does)"
        )),
        Some(reason) => {
            eprintln!("SKIPPED {test}: needs root and network namespaces ({reason})");
            Ok(false)
        }
    }
}

/// Whether this run is CI's (the `CI` variable, as GitHub Actions, GitLab and `.ci/run`
/// set it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var("PATH")
        .ok()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

pub fn init() {
    sandgate::tls::install_default_provider();
}

/// A CA for test origins, generated per run (never committed).
pub struct TestCa {
    pub dir: tempfile::TempDir,
    pub pem_path: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    pub der: CertificateDer<'static>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sandgate test origin CA");
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem_path = dir.path().join("origin-ca.pem");
        std::fs::write(&pem_path, cert.pem()).unwrap();
        let der = cert.der().clone();
        TestCa {
            dir,
            pem_path,
            issuer: Issuer::new(params, key),
            der,
        }
    }

    /// A server certificate for `names` and its key as PEM files in the CA's directory,
    /// for origins that are not Rust (the Python fakes in `tests/fixtures`).
    pub fn server_pem(&self, names: &[&str]) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = names
            .iter()
            .map(|n| SanType::DnsName((*n).try_into().unwrap()))
            .collect();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let stem = names.first().copied().unwrap_or("server");
        let cert_path = self.dir.path().join(format!("{stem}.crt"));
        let key_path = self.dir.path().join(format!("{stem}.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    pub fn server_config(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
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
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone(), self.der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// What an origin saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub version: String,
    pub headers: BTreeMap<String, String>,
}

/// An HTTP origin (TLS or plain) that echoes what it received and records every request.
pub struct Origin {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub connections: Arc<AtomicUsize>,
}

impl Origin {
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
    pub fn last(&self) -> Option<Seen> {
        self.seen.lock().unwrap().last().cloned()
    }
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

pub async fn start_origin(tls: Option<Arc<rustls::ServerConfig>>) -> Origin {
    start_origin_at("127.0.0.1", tls).await
}

/// [`start_origin`] on another local address (`127.0.0.2`, ...: all of 127/8 is loopback).
pub async fn start_origin_at(ip: &str, tls: Option<Arc<rustls::ServerConfig>>) -> Origin {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let connections: Arc<AtomicUsize> = Arc::default();
    let (seen2, conns2) = (seen.clone(), connections.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            conns2.fetch_add(1, Ordering::SeqCst);
            let seen = seen2.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let seen = seen.clone();
                    async move { Ok::<_, Infallible>(origin_handle(seen, req).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(config) => {
                        let Ok(stream) =
                            tokio_rustls::TlsAcceptor::from(config).accept(stream).await
                        else {
                            return;
                        };
                        let _ = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .await;
                    }
                    None => {
                        let _ = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    Origin {
        addr,
        seen,
        connections,
    }
}

type OriginBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn origin_handle(
    seen: Arc<Mutex<Vec<Seen>>>,
    mut req: Request<Incoming>,
) -> Response<OriginBody> {
    let record = Seen {
        method: req.method().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        version: format!("{:?}", req.version()),
        headers: req
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    };
    seen.lock().unwrap().push(record.clone());
    let path = req.uri().path().to_string();
    if path == "/ws" {
        let key = req
            .headers()
            .get("sec-websocket-key")
            .map(|k| k.as_bytes().to_vec())
            .unwrap_or_default();
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                TokioIo::new(upgraded),
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            while let Some(Ok(msg)) = ws.next().await {
                if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                    return;
                }
            }
        });
        return Response::builder()
            .status(101)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", accept)
            .body(Full::new(Bytes::new()).boxed())
            .unwrap();
    }
    if path == "/grpc" {
        // Read the whole request including its trailers, answer with data then trailers.
        let collected = req.into_body().collect().await.unwrap();
        let request_trailer = collected
            .trailers()
            .and_then(|t| t.get("x-request-trailer"))
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_else(|| "missing".into());
        let payload = collected.to_bytes();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("grpc-message", "ok".parse().unwrap());
        trailers.insert("x-echo-request-trailer", request_trailer.parse().unwrap());
        let frames = vec![
            Ok::<_, Infallible>(Frame::data(payload)),
            Ok(Frame::trailers(trailers)),
        ];
        let body = BodyExt::boxed(StreamBody::new(futures_util::stream::iter(frames)));
        return Response::builder()
            .header("content-type", "application/grpc")
            .body(body)
            .unwrap();
    }
    let json = serde_json::json!({
        "method": record.method, "path": record.path, "version": record.version,
        "headers": record.headers,
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json.to_string())).boxed())
        .unwrap()
}

/// Serves `router` over TLS on an ephemeral loopback port (the token endpoint fakes).
pub async fn serve_router(router: axum::Router, tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    serve_router_at("127.0.0.1:0", router, tls).await
}

/// [`serve_router`] on a given address (a fixed port, another loopback address).
pub async fn serve_router_at(
    addr: &str,
    router: axum::Router,
    tls: Arc<rustls::ServerConfig>,
) -> SocketAddr {
    use tower_service::Service as _;
    let listener = TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (router, tls) = (router.clone(), tls.clone());
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let mut router = router.clone();
                    async move { router.call(req.map(axum::body::Body::new)).await }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A TCP echo server (for opaque tunnels).
pub async fn start_tcp_echo() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count: Arc<AtomicUsize> = Arc::default();
    let c2 = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            c2.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, count)
}

pub struct IdentitySpec {
    pub id: &'static str,
    pub workspace: &'static str,
    pub allow_domains: Vec<&'static str>,
    pub credentials: Vec<&'static str>,
}

impl IdentitySpec {
    pub fn new(
        id: &'static str,
        workspace: &'static str,
        allow_domains: Vec<&'static str>,
    ) -> Self {
        IdentitySpec {
            id,
            workspace,
            allow_domains,
            credentials: Vec::new(),
        }
    }
}

/// An in-process gateway plus the files it was given.
pub struct Gateway {
    pub server: Server,
    pub dir: tempfile::TempDir,
    pub policy_dir: PathBuf,
    pub decision_log: PathBuf,
    pub sandgate_ca_pem: Vec<u8>,
}

pub struct GatewayOptions {
    pub identities: Vec<IdentitySpec>,
    pub hosts: Vec<(&'static str, &'static str)>,
    pub upstream_ca: Option<PathBuf>,
    pub extra_policies: Vec<(&'static str, String)>,
    pub extra_toml: String,
    /// Keys added to the `[proxy]` table, right after its `listen`.
    pub proxy_toml: String,
    /// `[store] url`: run on this Postgres database instead of a SQLite file in the test's
    /// directory (see [`postgres::TestDatabase`]).
    pub store_url: Option<String>,
    /// The master key file to use instead of a new one in the test's directory: a gateway
    /// started again on a shared store must unseal what the first one sealed.
    pub master_key_file: Option<PathBuf>,
    /// The SQLite file to use instead of a new one in the test's directory: a gateway
    /// restarted on the state an earlier one left.
    pub store_path: Option<PathBuf>,
    /// The `[log]` table's keys instead of `decisions = <decision_log>`.
    pub log_toml: Option<String>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            identities: vec![IdentitySpec::new(
                "sb-a",
                "ws-a",
                vec!["api.a.test", "*.wild.test", "plain.test", "meta.test"],
            )],
            hosts: vec![
                ("api.a.test", "127.0.0.1"),
                ("api.b.test", "127.0.0.1"),
                ("x.wild.test", "127.0.0.1"),
                ("plain.test", "127.0.0.1"),
                ("meta.test", "169.254.169.254"),
            ],
            upstream_ca: None,
            extra_policies: Vec::new(),
            extra_toml: String::new(),
            proxy_toml: String::new(),
            store_url: None,
            master_key_file: None,
            store_path: None,
            log_toml: None,
        }
    }
}

impl Gateway {
    pub async fn start(options: GatewayOptions) -> Gateway {
        Gateway::try_start(options)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    pub async fn try_start(options: GatewayOptions) -> Result<Gateway, String> {
        init();
        let dir = tempfile::tempdir().unwrap();
        let policy_dir = dir.path().join("policies");
        std::fs::create_dir_all(&policy_dir).unwrap();
        let repo_policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        for entry in std::fs::read_dir(&repo_policies).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rego") {
                std::fs::copy(&path, policy_dir.join(path.file_name().unwrap())).unwrap();
            }
        }
        for (name, text) in &options.extra_policies {
            let path = policy_dir.join(name);
            // Scope folders (`workspaces/<ws>/...`) are created as needed.
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let decision_log = dir.path().join("decisions.jsonl");
        let mut toml = String::new();
        toml.push_str("[proxy]\nlisten = \"127.0.0.1:0\"\n");
        toml.push_str(&options.proxy_toml);
        if !options.proxy_toml.is_empty() && !options.proxy_toml.ends_with('\n') {
            toml.push('\n');
        }
        if !options.proxy_toml.contains("deny_mode") {
            // Most tests check what is refused, and read it from the CONNECT's own 403; the
            // tests of how a refusal is shown inside the tunnel (the default) set it.
            toml.push_str("deny_mode = \"connect\"\n");
        }
        toml.push_str("[api]\nlisten = \"127.0.0.1:0\"\n");
        toml.push_str(&format!(
            "[tls]\nca_dir = {:?}\n",
            dir.path().join("certs").display().to_string()
        ));
        if let Some(ca) = &options.upstream_ca {
            toml.push_str(&format!(
                "upstream_ca_files = [{:?}]\n",
                ca.display().to_string()
            ));
        }
        toml.push_str("[dns.hosts]\n");
        for (name, ip) in &options.hosts {
            toml.push_str(&format!("{name:?} = {ip:?}\n"));
        }
        toml.push_str(&format!(
            "[policy]\ndir = {:?}\nreload_interval_ms = 100\n",
            policy_dir.display().to_string()
        ));
        match &options.log_toml {
            Some(keys) => toml.push_str(&format!("[log]\n{keys}\n")),
            None => toml.push_str(&format!(
                "[log]\ndecisions = {:?}\n",
                decision_log.display().to_string()
            )),
        }
        match &options.store_url {
            Some(url) => toml.push_str(&format!("[store]\nurl = {url:?}\n")),
            None => toml.push_str(&format!(
                "[store]\npath = {:?}\n",
                options
                    .store_path
                    .clone()
                    .unwrap_or_else(|| dir.path().join("data/sandgate.db"))
                    .display()
                    .to_string()
            )),
        }
        let master_key_file = options
            .master_key_file
            .clone()
            .unwrap_or_else(|| dir.path().join("data/master.key"));
        toml.push_str(&format!(
            "[secrets]\nmaster_key_file = {:?}\n",
            master_key_file.display().to_string()
        ));
        if !options.extra_toml.contains("[local]") {
            // Local sandboxes (the default pool) live in the test's directory too.
            toml.push_str(&format!(
                "[local]\ndir = {:?}\nsnapshot_dir = {:?}\n",
                dir.path().join("local/sandboxes").display().to_string(),
                dir.path().join("local/snapshots").display().to_string()
            ));
        }
        if !options.extra_toml.contains("[ports]") {
            // The ports gateway on an ephemeral port: gateways of parallel tests never
            // compete for the default one.
            toml.push_str("[ports]\nlisten = \"127.0.0.1:0\"\n");
        }
        toml.push_str(&options.extra_toml);
        if !options.extra_toml.contains("[egress]") {
            // The test origins listen on loopback; a test with an `[egress]` table of its
            // own says what it exempts.
            toml.push_str("[egress]\nallow_private = [\"127.0.0.0/8\"]\n");
        }
        for identity in &options.identities {
            toml.push_str(&format!(
                "[[egress.identities]]\nid = {:?}\ntoken = {:?}\nworkspace = {:?}\nallow_domains = {:?}\ncredentials = {:?}\n",
                identity.id, TOKEN, identity.workspace, identity.allow_domains, identity.credentials
            ));
        }
        let config = Config::from_toml(&toml).map_err(|e| format!("{e}\n{toml}"))?;
        let server = Server::start(config).await.map_err(|e| e.to_string())?;
        let sandgate_ca_pem = std::fs::read(server.ca_cert_path()).unwrap();
        Ok(Gateway {
            server,
            dir,
            policy_dir,
            decision_log,
            sandgate_ca_pem,
        })
    }

    pub fn proxy_url(&self, id: &str, token: &str) -> String {
        format!("http://{id}:{token}@{}", self.server.proxy_addr())
    }

    /// A reqwest client that goes through the gateway as sandbox `id`, trusting only the
    /// gateway's CA (as a sandbox does).
    pub fn client(&self, id: &str, http1_only: bool) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(self.proxy_url(id, TOKEN)).unwrap())
            .tls_certs_only([reqwest::Certificate::from_pem(&self.sandgate_ca_pem).unwrap()])
            .timeout(Duration::from_secs(10));
        if http1_only {
            builder = builder.http1_only();
        }
        builder.build().unwrap()
    }

    /// `GET {path}` on the API with a bearer `token`: the answer's body, whatever its status.
    pub async fn api_get(&self, path: &str, token: &str) -> String {
        reqwest::Client::new()
            .get(self.api(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// `POST {path}` on the API with a JSON `body` and a bearer `token`: the status and the
    /// answer (JSON, or its text as a string).
    pub async fn api_post(
        &self,
        path: &str,
        token: &str,
        body: &serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let r = reqwest::Client::new()
            .post(self.api(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, value)
    }

    /// [`Gateway::api_get`], read as JSON.
    pub async fn api_json(&self, path: &str, token: &str) -> serde_json::Value {
        let text = self.api_get(path, token).await;
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
    }

    /// Egress decision records (`kind: "egress"`) written so far (waits briefly for the
    /// writer thread).
    pub async fn decisions(&self, min: usize) -> Vec<serde_json::Value> {
        self.log_records(min, |r| r["kind"] == "egress").await
    }

    /// Egress records, once `done` holds for them (records are written by a separate
    /// thread, so a count short of the full set can be reached before the last one lands).
    pub async fn decisions_until(
        &self,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let mut records = Vec::new();
        for _ in 0..250 {
            records = self.log_records(0, |r| r["kind"] == "egress").await;
            if done(&records) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        records
    }

    /// Policy engine records (`kind: "policy"`) of `layer`.
    pub async fn policy_decisions(&self, layer: &str, min: usize) -> Vec<serde_json::Value> {
        self.log_records(min, |r| r["kind"] == "policy" && r["layer"] == layer)
            .await
    }

    /// Decision log lines matching `keep`, once at least `min` are there.
    pub async fn log_records(
        &self,
        min: usize,
        keep: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        for _ in 0..100 {
            let records: Vec<serde_json::Value> = std::fs::read_to_string(&self.decision_log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .filter(|r| keep(r))
                .collect();
            if records.len() >= min {
                return records;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("fewer than {min} matching decision records were written");
    }

    /// A CONNECT tunnel to `host:port` as sandbox `id`, then TLS with `sni` and `alpn`,
    /// trusting only the gateway's CA.
    pub async fn tls_tunnel(
        &self,
        id: &str,
        host: &str,
        port: u16,
        sni: &str,
        alpn: &[&[u8]],
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let stream = connect_tunnel(
            self.server.proxy_addr(),
            &format!("{host}:{port}"),
            Some((id, TOKEN)),
        )
        .await
        .map_err(|(status, text)| {
            std::io::Error::other(format!("CONNECT refused ({status}): {text}"))
        })?;
        tls_over(stream, &self.sandgate_ca_pem, sni, alpn).await
    }

    pub fn api(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.api_addr())
    }

    /// The sum of every series of metric `name` in this gateway's `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(self.api("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// Opens a CONNECT tunnel by hand and returns the raw stream after `200`, or the status
/// line and body of a refusal.
pub async fn connect_tunnel(
    proxy: SocketAddr,
    authority: &str,
    auth: Option<(&str, &str)>,
) -> Result<TcpStream, (u16, String)> {
    use base64::Engine as _;
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some((id, token)) = auth {
        let enc = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{token}"));
        head.push_str(&format!("Proxy-Authorization: Basic {enc}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.unwrap();
        assert!(n > 0, "proxy closed during CONNECT response");
        buf.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let status: u16 = text[9..12].parse().unwrap();
    if status == 200 {
        return Ok(stream);
    }
    let length = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    Err((status, format!("{text}{}", String::from_utf8_lossy(&body))))
}

/// TLS client over a tunnel, trusting `ca_pem`, with the given SNI and ALPN.
pub async fn tls_over(
    stream: TcpStream,
    ca_pem: &[u8],
    sni: &str,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    connector
        .connect(ServerName::try_from(sni.to_string()).unwrap(), stream)
        .await
}

/// A `sandgate serve` process started by a test; killed when dropped.
pub struct Served {
    pub child: std::process::Child,
    pub proxy: SocketAddr,
    pub api: SocketAddr,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        // A failing test shows what the server said last (a CI log is all there is then).
        if std::thread::panicking() {
            let lines = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
            for line in lines.iter().skip(lines.len().saturating_sub(60)) {
                eprintln!("[sandgate {}] {line}", self.api);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `command` (the `sandgate` binary, or a wrapper that execs it) and waits for the
/// line announcing the proxy and API addresses.
pub fn serve_process(mut command: std::process::Command) -> Served {
    use std::io::BufRead;
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("sandgate starts");
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let stderr = child.stderr.take().unwrap();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().unwrap().push(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found = lines.lock().unwrap().iter().find_map(|l| {
            let rest = l.strip_prefix("sandgate: proxy on http://")?;
            let proxy = rest.split_whitespace().next()?.to_string();
            let api = rest
                .split("API on http://")
                .nth(1)?
                .split(',')
                .next()?
                .to_string();
            Some((proxy, api))
        });
        if let Some((proxy, api)) = found {
            return Served {
                child,
                proxy: proxy.parse().unwrap(),
                api: api.trim().parse().unwrap(),
                stderr: lines,
            };
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("sandgate exited with {status}: {:?}", lines.lock().unwrap());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sandgate did not start: {:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A config for `sandgate serve` with everything under `dir`: the bundled policies copied
/// there, listeners on ephemeral loopback ports, loopback exempt from the private-address
/// guard, and `extra` appended (its own tables: `[proxy]` and `[api]` keys go in `proxy`
/// and `api`).
pub fn process_config(dir: &Path, proxy: &str, api: &str, extra: &str) -> String {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap()
    {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rego") {
            std::fs::copy(&path, policies.join(path.file_name().unwrap())).unwrap();
        }
    }
    let p = |name: &str| dir.join(name).display().to_string();
    format!(
        r#"
[proxy]
listen = "127.0.0.1:0"
{proxy}
[api]
listen = "127.0.0.1:0"
{api}
[tls]
ca_dir = {certs:?}
[policy]
dir = {policies:?}
[log]
decisions = {decisions:?}
[store]
path = {db:?}
[secrets]
master_key_file = {key:?}
[local]
dir = {local:?}
snapshot_dir = {snaps:?}
{extra}
"#,
        certs = p("certs"),
        policies = p("policies"),
        decisions = p("decisions.jsonl"),
        db = p("data/sandgate.db"),
        key = p("data/master.key"),
        local = p("local/sandboxes"),
        snaps = p("local/snapshots"),
    )
}

/// Everything `tracing` wrote in this test binary, once [`capture_logs`] ran: tests that
/// check no secret reaches a log line read it. The subscriber is the process's global default
/// (a gateway's tasks run on any runtime thread, so a thread-scoped one would miss lines), and
/// every integration test shares this process: the buffer holds every test's lines since the
/// first capture, so those checks read at least their own.
pub fn captured_logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: std::sync::OnceLock<Mutex<Vec<u8>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(Default::default)
}

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        captured_logs().lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends this binary's `tracing` output (sandgate at debug) to [`captured_logs`].
pub fn capture_logs() {
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("sandgate=debug")
            .with_writer(|| Capture)
            .with_ansi(false)
            .try_init();
    });
}

/// Gives this test's gateways their own metrics: from now on this thread, and every thread a
/// gateway started here starts, records into a new recorder, and those gateways' `/metrics`
/// show only what they did. For a test that asserts an exact value of a metric no label of
/// its own tells apart (connections open now, sandboxes expired so far): every integration
/// test shares this process, and the process-wide recorder counts all of them.
///
/// Call it first, on the thread the test's runtime runs on (`#[tokio::test]`'s default
/// runtime runs every task there; a multi-thread runtime enters the scope on each of its
/// threads with `on_thread_start`).
pub fn own_metrics() -> sandgate::telemetry::MetricsScope {
    let scope = sandgate::telemetry::MetricsScope::new();
    scope.enter();
    scope
}

/// A child process (a Python fake) killed when dropped.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A script in `tests/fixtures`.
/// `PATH` with the directory of the `sandgate` binary under test first, for scripts that
/// run `sandgate` by name (completion scripts, the README's blocks).
pub fn path_with_sandgate() -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_sandgate"));
    let dir = bin.parent().unwrap().display();
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The port a fake wrote to `port_file` once it listens (it writes atomically).
pub async fn wait_port_file(port_file: &Path, child: &mut std::process::Child) -> u16 {
    for _ in 0..300 {
        if let Ok(text) = std::fs::read_to_string(port_file) {
            if let Ok(port) = text.trim().parse() {
                return port;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the fake exited with {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the fake did not start");
}

pub mod fakes;
pub mod own_sdk;
pub mod postgres;
pub mod sdk;
