//! The egress boundary under attack: a hostile sandbox over real sockets (raw hyper clients
//! where reqwest would tidy the attack away, reqwest where it would not), an origin that
//! reflects what it receives the ways real APIs do, real SQLite, the bundled Rego.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const SECRET_GH: &str = "ghp_REAL-0123456789abcdef";
const SECRET_BASIC: &str = "basic-Pass/word+1";
const SECRET_QUERY: &str = "q s3cret/+&=";
const SECRET_BODY: &str = "body-secret-7c1d9e";
const ADMIN: &str = "api-token-ws-a-attacks-0123";

const HOSTS: [&str; 5] = [
    "api.a.test",
    "basic.a.test",
    "query.a.test",
    "scrub.a.test",
    "api.b.test",
];

// ------------------------------------------------------------------ the reflecting origin

/// What the origin received: the request head, and the trailers if the body completed.
#[derive(Debug, Clone)]
struct Got {
    method: String,
    path: String,
    headers: BTreeMap<String, String>,
    trailers: Option<BTreeMap<String, String>>,
    body_complete: bool,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Got>>>);

impl Log {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn last(&self) -> Got {
        self.0
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the origin got a request")
    }
    fn all_text(&self) -> String {
        format!("{:?}", self.0.lock().unwrap())
    }
}

type OriginBody = BoxBody<Bytes, Infallible>;

fn map(headers: &HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// An HTTPS origin for every test host that hands back what it got:
/// - `/…/reflect`: the `Authorization` header and the query in response headers, both and
///   `X-Api-Key` in a text body streamed three bytes at a time, `Authorization` in trailers;
/// - `/…/ws`: a 101 WebSocket answer carrying the `Authorization` header;
/// - `/…/gzip`: a gzip-encoded text body;
/// - anything else: a JSON echo of the request head.
async fn start_reflector(ca: &TestCa) -> (SocketAddr, Log) {
    let tls = ca.server_config(&HOSTS);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Log::default();
    let log2 = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (tls, log) = (tls.clone(), log2.clone());
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let log = log.clone();
                    async move { Ok::<_, Infallible>(reflect(log, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, log)
}

async fn reflect(log: Log, mut req: Request<Incoming>) -> Response<OriginBody> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let index = {
        let mut all = log.0.lock().unwrap();
        all.push(Got {
            method: req.method().to_string(),
            path: path.clone(),
            headers: map(req.headers()),
            trailers: None,
            body_complete: false,
        });
        all.len() - 1
    };
    let auth = req
        .headers()
        .get("authorization")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let api_key = req
        .headers()
        .get("x-api-key")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let query = req.uri().query().unwrap_or("").to_string();
    if path.ends_with("/ws") {
        let key = req
            .headers()
            .get("sec-websocket-key")
            .map(|k| k.as_bytes().to_vec());
        let accept =
            tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key.unwrap_or_default());
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 64];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        });
        return Response::builder()
            .status(101)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", accept)
            .header("x-echo-auth", auth)
            .body(Full::new(Bytes::new()).boxed())
            .unwrap();
    }
    let collected = req.into_body().collect().await;
    if let Ok(collected) = &collected {
        let mut all = log.0.lock().unwrap();
        all[index].body_complete = true;
        all[index].trailers = collected.trailers().map(map);
    }
    if path.ends_with("/gzip") {
        return Response::builder()
            .header("content-type", "text/plain")
            .header("content-encoding", "gzip")
            .body(Full::new(Bytes::from_static(b"\x1f\x8b not really")).boxed())
            .unwrap();
    }
    if path.contains("/reflect") {
        let mut text = b"auth=".to_vec();
        text.extend_from_slice(&auth);
        text.extend_from_slice(b" key=");
        text.extend_from_slice(&api_key);
        text.extend_from_slice(format!(" query={query} end").as_bytes());
        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = text
            .chunks(3)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-echo-auth-trailer", auth.clone().try_into().unwrap());
        frames.push(Ok(Frame::trailers(trailers)));
        return Response::builder()
            .header("content-type", "text/plain; charset=utf-8")
            .header("x-echo-auth", auth)
            .header("x-echo-query", query)
            .header("trailer", "x-echo-auth-trailer")
            .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
            .unwrap();
    }
    let got = log.0.lock().unwrap()[index].clone();
    let body = json!({"method": got.method, "path": got.path, "headers": got.headers});
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

// ------------------------------------------------------------------ the gateway

struct Setup {
    gw: Gateway,
    origin: SocketAddr,
    log: Log,
    _ca: TestCa,
    _secrets: tempfile::TempDir,
}

impl Setup {
    fn port(&self) -> u16 {
        self.origin.port()
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port())
    }

    async fn placeholder(&self, id: &str, name: &str) -> String {
        let env: Value = reqwest::Client::new()
            .get(self.gw.api(&format!("/v1/identities/{id}/env")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        env["placeholders"][name].as_str().unwrap().to_string()
    }

    /// A raw HTTP/1.1 or h2 connection through a fresh tunnel to `host` as `sb-a`.
    async fn raw(&self, host: &str, h2: bool) -> Raw {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let tls = self
            .gw
            .tls_tunnel("sb-a", host, self.port(), host, alpn)
            .await
            .unwrap();
        Raw::over(TokioIo::new(tls), h2).await
    }
}

fn credential_toml(port: u16, dir: &std::path::Path) -> String {
    for (name, secret) in [
        ("gh", SECRET_GH),
        ("basic", SECRET_BASIC),
        ("q", SECRET_QUERY),
        ("body", SECRET_BODY),
    ] {
        std::fs::write(dir.join(name), secret).unwrap();
    }
    let file = |name: &str| dir.join(name).display().to_string();
    format!(
        r#"
[[api.tokens]]
token = "{ADMIN}"
principal = "alice"
workspace = "ws-a"

[[credentials]]
workspace = "ws-a"
name = "gh"
secret_file = {gh:?}
placeholder_env = "GH_TOKEN"
destinations = [{{ host = "api.a.test", ports = [{port}], methods = ["GET"], path_prefix = "/repos/" }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}

[[credentials]]
workspace = "ws-a"
name = "basic"
secret_file = {basic:?}
destinations = [{{ host = "basic.a.test", ports = [{port}] }}]
apply = {{ type = "basic", username = "bot" }}

[[credentials]]
workspace = "ws-a"
name = "q"
secret_file = {q:?}
destinations = [{{ host = "query.a.test", ports = [{port}] }}]
apply = {{ type = "query", param = "key" }}

[[credentials]]
workspace = "ws-a"
name = "body"
secret_file = {body:?}
scrub_response_body = true
destinations = [{{ host = "scrub.a.test", ports = [{port}] }}]
apply = {{ type = "header", name = "x-api-key", template = "{{secret}}" }}
"#,
        gh = file("gh"),
        basic = file("basic"),
        q = file("q"),
        body = file("body"),
    )
}

async fn setup_with(extra_toml: &str, extra_policies: Vec<(&'static str, String)>) -> Setup {
    init();
    let ca = TestCa::new();
    let (origin, log) = start_reflector(&ca).await;
    let secrets = tempfile::tempdir().unwrap();
    let mut toml = credential_toml(origin.port(), secrets.path());
    toml.push_str(extra_toml);
    let mut hosts: Vec<(&'static str, &'static str)> =
        HOSTS.iter().map(|h| (*h, "127.0.0.1")).collect();
    hosts.push(("loop6.test", "::1"));
    let gw = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec {
            id: "sb-a",
            workspace: "ws-a",
            allow_domains: HOSTS
                .iter()
                .copied()
                .chain(["*.b.test", "loop6.test"])
                .collect(),
            credentials: vec!["gh", "basic", "q", "body"],
        }],
        hosts,
        upstream_ca: Some(ca.pem_path.clone()),
        extra_policies,
        extra_toml: toml,
        ..GatewayOptions::default()
    })
    .await;
    Setup {
        gw,
        origin,
        log,
        _ca: ca,
        _secrets: secrets,
    }
}

async fn setup() -> Setup {
    setup_with("", vec![]).await
}

// ------------------------------------------------------------------ raw clients

type ReqBody = BoxBody<Bytes, Infallible>;

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<ReqBody>),
    H2(hyper::client::conn::http2::SendRequest<ReqBody>),
}

/// A raw hyper client connection: sends exactly the URI it is given (no normalisation).
struct Raw {
    sender: Sender,
    conn: tokio::task::JoinHandle<()>,
}

/// A collected answer.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn code(&self) -> String {
        self.headers
            .get("x-sandgate-error")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    }
    fn everything(&self) -> String {
        format!(
            "{:?} {} {:?}",
            self.headers,
            String::from_utf8_lossy(&self.body),
            self.trailers
        )
    }
}

impl Raw {
    async fn over<T>(io: TokioIo<T>, h2: bool) -> Raw
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        if h2 {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            Raw {
                sender: Sender::H2(sender),
                conn,
            }
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            let conn = tokio::spawn(async move {
                let _ = conn.with_upgrades().await;
            });
            Raw {
                sender: Sender::H1(sender),
                conn,
            }
        }
    }

    fn is_h2(&self) -> bool {
        matches!(self.sender, Sender::H2(_))
    }

    async fn response(&mut self, req: Request<ReqBody>) -> hyper::Result<Response<Incoming>> {
        match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }

    /// Sends `req` (`path` is the whole request target after the authority) and collects
    /// the answer.
    async fn send(&mut self, req: Request<ReqBody>) -> hyper::Result<Answer> {
        let response = self.response(req).await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let collected = response.into_body().collect().await?;
        Ok(Answer {
            status,
            headers,
            trailers: collected.trailers().cloned(),
            body: collected.to_bytes().to_vec(),
        })
    }

    fn get(&self, host: &str, port: u16, path: &str) -> http::request::Builder {
        let builder = Request::builder().method("GET");
        if self.is_h2() {
            builder.uri(format!("https://{host}:{port}{path}"))
        } else {
            builder.uri(path).header("host", format!("{host}:{port}"))
        }
    }
}

fn empty() -> ReqBody {
    Empty::new().boxed()
}

// ------------------------------------------------------------------ 1. no panic on any input

/// An `Authorization` value whose byte 6 falls inside a multi-byte character used to panic
/// the request task (the client got an empty reply). It must get an answer like any other.
#[tokio::test]
async fn a_multibyte_authorization_header_gets_an_answer() {
    let s = setup().await;
    for (h2, path) in [(false, "/repos/x"), (true, "/other"), (false, "/other")] {
        let mut raw = s.raw("api.a.test", h2).await;
        for value in ["abcd€xyz", "Basic €€", "basi€ x", "Basic"] {
            let req = raw
                .get("api.a.test", s.port(), path)
                .header(
                    "authorization",
                    http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                )
                .body(empty())
                .unwrap();
            let answer = raw
                .send(req)
                .await
                .expect("an answer, not a dropped connection");
            assert_eq!(
                answer.status,
                200,
                "{value:?} h2={h2}: {}",
                answer.everything()
            );
        }
    }
    s.gw.server.shutdown();
}

// ------------------------------------------------------------------ 2. revocation

fn simulated_pool() -> &'static str {
    r#"
[[providers]]
name = "sim"
kind = "simulated"
capabilities = { isolation = ["microvm"], egress = "gateway" }
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "pool"
provider = "sim"
account = "acct"
"#
}

/// Deleting a sandbox ends its open tunnels (h1, h2, and an upgraded WebSocket) within a
/// second, and nothing reaches the origin under its identity afterwards.
#[tokio::test]
async fn deleting_a_sandbox_cuts_its_open_tunnels_at_once() {
    let s = setup_with(simulated_pool(), vec![]).await;
    let http = reqwest::Client::new();
    let created: Value = http
        .post(s.gw.api("/v1/sandboxes"))
        .bearer_auth(ADMIN)
        .json(&json!({"network": {"allow_domains": ["api.a.test"]}, "credentials": ["gh"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().expect("created").to_string();
    let token = created["egress"]["token"].as_str().unwrap().to_string();

    let mut open = Vec::new();
    for h2 in [false, true] {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let stream = connect_tunnel(
            s.gw.server.proxy_addr(),
            &format!("api.a.test:{}", s.port()),
            Some((&id, &token)),
        )
        .await
        .unwrap();
        let tls = tls_over(stream, &s.gw.sandgate_ca_pem, "api.a.test", alpn)
            .await
            .unwrap();
        let mut raw = Raw::over(TokioIo::new(tls), h2).await;
        let answer = raw
            .send(
                raw.get("api.a.test", s.port(), "/repos/x")
                    .body(empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(
            s.log.last().headers["authorization"],
            format!("Bearer {SECRET_GH}")
        );
        open.push(raw);
    }
    // An upgraded stream: a WebSocket whose bytes the origin echoes.
    let stream = connect_tunnel(
        s.gw.server.proxy_addr(),
        &format!("api.a.test:{}", s.port()),
        Some((&id, &token)),
    )
    .await
    .unwrap();
    let tls = tls_over(stream, &s.gw.sandgate_ca_pem, "api.a.test", &[b"http/1.1"])
        .await
        .unwrap();
    let mut ws_conn = Raw::over(TokioIo::new(tls), false).await;
    let upgrade = ws_conn
        .get("api.a.test", s.port(), "/repos/ws")
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .body(empty())
        .unwrap();
    let mut switched = ws_conn.response(upgrade).await.unwrap();
    assert_eq!(switched.status(), 101);
    let mut ws = TokioIo::new(hyper::upgrade::on(&mut switched).await.unwrap());
    ws.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    ws.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");

    let before = s.log.count();
    let deleted = http
        .delete(s.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let revoked_at = Instant::now();

    for mut raw in open {
        let ended = tokio::time::timeout(Duration::from_secs(1), &mut raw.conn).await;
        assert!(
            ended.is_ok(),
            "a tunnel was still open a second after the delete"
        );
        let req = raw
            .get("api.a.test", s.port(), "/repos/x")
            .body(empty())
            .unwrap();
        assert!(
            raw.send(req).await.is_err(),
            "a request went through after the delete"
        );
    }
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(1), ws.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "the WebSocket was still open a second after the delete"
    );
    assert!(revoked_at.elapsed() < Duration::from_secs(2));
    assert_eq!(
        s.log.count(),
        before,
        "the origin got a request after the delete"
    );
    s.gw.server.shutdown();
}

/// A credential deleted through the API is not applied on a tunnel that is already open.
#[tokio::test]
async fn a_deleted_credential_stops_being_applied_on_open_tunnels() {
    let s = setup().await;
    let mut raw = s.raw("api.a.test", true).await;
    let req = |raw: &Raw| {
        raw.get("api.a.test", s.port(), "/repos/x")
            .body(empty())
            .unwrap()
    };
    assert_eq!(raw.send(req(&raw)).await.unwrap().status, 200);
    assert_eq!(
        s.log.last().headers["authorization"],
        format!("Bearer {SECRET_GH}")
    );
    let deleted = reqwest::Client::new()
        .delete(s.gw.api("/v1/workspaces/ws-a/credentials/gh"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(raw.send(req(&raw)).await.unwrap().status, 200);
    assert!(!s.log.last().headers.contains_key("authorization"));
    s.gw.server.shutdown();
}

// ------------------------------------------------------------------ 4. the declared slot

/// Host, path and extra headers of one attempt.
type Attack = (&'static str, String, Vec<(String, String)>);

/// A placeholder is honoured only in its own credential's slot; anywhere else, in any
/// encoding, the request is refused and nothing reaches the origin.
#[tokio::test]
async fn placeholders_out_of_their_slot_are_refused_and_never_forwarded() {
    let s = setup().await;
    let gh = s.placeholder("sb-a", "gh").await;
    let hex = &gh[5..];
    let basic_unpadded =
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(format!("me:{gh}x"));
    let attacks: Vec<Attack> = vec![
        (
            "api.a.test",
            "/repos/x".into(),
            vec![("x-title".into(), format!("issue {gh}"))],
        ),
        ("api.a.test", format!("/repos/x?q={gh}"), vec![]),
        ("api.a.test", format!("/repos/x?q=sgph%5F{hex}"), vec![]),
        ("api.a.test", format!("/repos/%73gph_{hex}"), vec![]),
        ("api.a.test", format!("/repos/{gh}"), vec![]),
        (
            "api.a.test",
            "/repos/x".into(),
            vec![(gh.clone(), "1".into())],
        ),
        (
            "api.a.test",
            "/repos/x".into(),
            vec![("cookie".into(), format!("s={}", gh.to_uppercase()))],
        ),
        // Its slot, but not a destination it is bound to.
        (
            "api.b.test",
            "/".into(),
            vec![("authorization".into(), format!("Bearer {gh}"))],
        ),
        (
            "api.b.test",
            "/".into(),
            vec![("authorization".into(), format!("Basic {basic_unpadded}"))],
        ),
        // Another credential's slot, on that other credential's destination.
        (
            "basic.a.test",
            "/".into(),
            vec![("authorization".into(), format!("Bearer {gh}"))],
        ),
    ];
    for h2 in [false, true] {
        let mut raw_by_host = BTreeMap::new();
        for (host, path, headers) in &attacks {
            if !raw_by_host.contains_key(host) {
                raw_by_host.insert(*host, s.raw(host, h2).await);
            }
            let raw = raw_by_host.get_mut(host).unwrap();
            let mut req = raw.get(host, s.port(), path);
            for (name, value) in headers {
                req = req.header(name.as_str(), value.as_str());
            }
            let before = s.log.count();
            let answer = raw.send(req.body(empty()).unwrap()).await.unwrap();
            assert_eq!(
                answer.status,
                403,
                "{host}{path} {headers:?} h2={h2}: {}",
                answer.everything()
            );
            assert_eq!(answer.code(), "credential_destination_mismatch");
            assert_eq!(
                s.log.count(),
                before,
                "{host}{path} {headers:?} reached the origin"
            );
        }
    }
    // The declared slot itself works: the origin gets the real credential there.
    let mut raw = s.raw("api.a.test", false).await;
    let req = raw
        .get("api.a.test", s.port(), "/repos/x")
        .header("authorization", format!("Bearer {gh}"))
        .body(empty())
        .unwrap();
    assert_eq!(raw.send(req).await.unwrap().status, 200);
    assert_eq!(
        s.log.last().headers["authorization"],
        format!("Bearer {SECRET_GH}")
    );
    assert!(
        !s.log.all_text().contains(hex),
        "a placeholder reached the origin"
    );

    // Placeholders never reach the decision log either.
    let records = s.gw.decisions(attacks.len() * 2).await;
    for record in &records {
        assert!(
            !record.to_string().to_ascii_lowercase().contains(hex),
            "{record}"
        );
    }
    s.gw.server.shutdown();
}

/// Trailers are never a slot: a request whose trailers carry a placeholder is aborted
/// upstream before the trailer is sent (h2 frames, and an h1 chunked body by hand).
#[tokio::test]
async fn a_placeholder_in_request_trailers_is_never_forwarded() {
    let s = setup().await;
    let gh = s.placeholder("sb-a", "gh").await;
    // h2: a body with trailers.
    let mut raw = s.raw("api.a.test", true).await;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-note", gh.parse().unwrap());
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"hello"))),
        Ok(Frame::trailers(trailers)),
    ];
    let req = Request::builder()
        .method("POST")
        .uri(format!("https://api.a.test:{}/upload", s.port()))
        .header("te", "trailers")
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap();
    let answer = raw.send(req).await;
    assert!(!answer.is_ok_and(|a| a.status == 200), "accepted");
    // h1: chunked with a trailer, written by hand.
    let mut tls =
        s.gw.tls_tunnel("sb-a", "api.a.test", s.port(), "api.a.test", &[b"http/1.1"])
            .await
            .unwrap();
    let head = format!(
        "POST /upload HTTP/1.1\r\nhost: api.a.test:{}\r\ntransfer-encoding: chunked\r\ntrailer: x-note\r\nte: trailers\r\n\r\n5\r\nhello\r\n0\r\nx-note: {gh}\r\n\r\n",
        s.port()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut reply = vec![0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut reply)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = s.log.all_text();
    assert!(
        !seen.contains(&gh[5..]),
        "a trailer placeholder reached the origin: {seen}"
    );
    assert!(
        !seen.contains(SECRET_GH),
        "a secret reached the origin: {seen}"
    );
    let records = s.gw.log_records(2, |r| r["phase"] == "trailers").await;
    assert!(records
        .iter()
        .all(|r| r["code"] == "credential_destination_mismatch"));
    s.gw.server.shutdown();
}

/// A CONNECT (or absolute-form) host that carries a placeholder would carry it out in the
/// DNS lookup: it is refused before any lookup, even where `*.b.test` is allowed.
#[tokio::test]
async fn a_destination_host_carrying_a_placeholder_is_refused_unresolved() {
    let s = setup().await;
    let gh = s.placeholder("sb-a", "gh").await;
    let (status, text) = connect_tunnel(
        s.gw.server.proxy_addr(),
        &format!("{gh}.b.test:443"),
        Some(("sb-a", TOKEN)),
    )
    .await
    .expect_err("refused");
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("credential_destination_mismatch"), "{text}");
    let response = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(s.gw.proxy_url("sb-a", TOKEN)).unwrap())
        .build()
        .unwrap()
        .get(format!("http://{}.b.test/", gh.to_uppercase()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(
        response.headers()["x-sandgate-error"],
        "credential_destination_mismatch"
    );
    let records = s.gw.decisions(2).await;
    for record in records {
        assert!(
            !record.to_string().to_ascii_lowercase().contains(&gh[5..]),
            "{record}"
        );
    }
    s.gw.server.shutdown();
}

// ------------------------------------------------------------------ response scrubbing

/// Whatever the origin reflects comes back without the secret: response headers (the exact
/// `Basic` encoding sandgate produced, the percent-encoded query form), h2 and h1 trailers,
/// 101 responses (h1) and extended-CONNECT answers (h2).
#[tokio::test]
async fn reflected_secrets_are_scrubbed_on_every_response_path() {
    let s = setup().await;
    let basic_form =
        base64::engine::general_purpose::STANDARD.encode(format!("bot:{SECRET_BASIC}"));
    let query_form = percent_encode(SECRET_QUERY);
    let forms = [
        SECRET_GH.to_string(),
        SECRET_BASIC.to_string(),
        SECRET_QUERY.to_string(),
        basic_form.clone(),
        query_form.clone(),
    ];
    let clean = |what: &str, text: &str| {
        for form in &forms {
            assert!(!text.contains(form.as_str()), "{what} leaks {form}: {text}");
        }
    };
    for h2 in [false, true] {
        // basic: the origin reflects `Authorization: Basic base64(bot:secret)`.
        let mut raw = s.raw("basic.a.test", h2).await;
        let req = raw
            .get("basic.a.test", s.port(), "/reflect")
            .header("te", "trailers")
            .body(empty())
            .unwrap();
        let answer = raw.send(req).await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(
            s.log.last().headers["authorization"],
            format!("Basic {basic_form}")
        );
        assert!(answer.headers["x-echo-auth"]
            .to_str()
            .unwrap()
            .contains("[redacted by sandgate]"));
        let trailers = answer.trailers.clone().expect("trailers");
        assert!(trailers["x-echo-auth-trailer"]
            .to_str()
            .unwrap()
            .contains("[redacted by sandgate]"));
        clean(
            "basic answer headers and trailers",
            &format!("{:?} {:?}", answer.headers, answer.trailers),
        );

        // query: the origin reflects the query, where the secret is percent-encoded.
        let mut raw = s.raw("query.a.test", h2).await;
        let req = raw
            .get("query.a.test", s.port(), "/reflect?x=1")
            .body(empty())
            .unwrap();
        let answer = raw.send(req).await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(s.log.last().path, format!("/reflect?x=1&key={query_form}"));
        clean(
            "query answer headers",
            &format!("{:?} {:?}", answer.headers, answer.trailers),
        );

        // gh over a WebSocket handshake: the 101 (h1) or 200 (h2) answer reflects it.
        let mut raw = s.raw("api.a.test", h2).await;
        if h2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut req = Request::builder()
            .method(if h2 { "CONNECT" } else { "GET" })
            .header("sec-websocket-version", "13");
        req = if h2 {
            req.uri(format!("https://api.a.test:{}/repos/ws", s.port()))
        } else {
            req.uri("/repos/ws")
                .header("host", format!("api.a.test:{}", s.port()))
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        };
        let mut req = req.body(empty()).unwrap();
        if h2 {
            req.extensions_mut()
                .insert(hyper::ext::Protocol::from_static("websocket"));
        }
        let response = raw.response(req).await.unwrap();
        assert_eq!(response.status().as_u16(), if h2 { 200 } else { 101 });
        assert_eq!(
            s.log.last().headers["authorization"],
            format!("Bearer {SECRET_GH}")
        );
        assert!(response.headers()["x-echo-auth"]
            .to_str()
            .unwrap()
            .contains("[redacted by sandgate]"));
        clean(
            "upgrade answer headers",
            &format!("{:?}", response.headers()),
        );
    }
    s.gw.server.shutdown();
}

fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `scrub_response_body` removes the secret from a text body streamed in small chunks (so
/// the secret is split across them), asks the origin for no compression, and refuses a
/// compressed text body it could not scrub.
#[tokio::test]
async fn scrub_response_body_removes_the_secret_from_streamed_text_bodies() {
    let s = setup().await;
    for h2 in [false, true] {
        let mut raw = s.raw("scrub.a.test", h2).await;
        let req = raw
            .get("scrub.a.test", s.port(), "/reflect")
            .body(empty())
            .unwrap();
        let answer = raw.send(req).await.unwrap();
        assert_eq!(answer.status, 200);
        let got = s.log.last();
        assert_eq!(got.headers["x-api-key"], SECRET_BODY);
        assert_eq!(got.headers["accept-encoding"], "identity");
        let text = answer.everything();
        assert!(!text.contains(SECRET_BODY), "{text}");
        assert!(text.contains("[redacted by sandgate]"), "{text}");
        let req = raw
            .get("scrub.a.test", s.port(), "/gzip")
            .body(empty())
            .unwrap();
        let answer = raw.send(req).await.unwrap();
        assert_eq!(answer.status, 502);
        assert_eq!(answer.code(), "response_unscrubbable");
    }
    s.gw.server.shutdown();
}

// ------------------------------------------------------------------ 5. canonical paths

/// A GET-only `/repos/` credential is not attached to paths that climb out of `/repos/`,
/// however they are spelled (reqwest would normalise them, so a raw client sends them), and
/// the origin gets the canonical path the decision was made on.
#[tokio::test]
async fn credential_paths_are_checked_as_the_origin_reads_them() {
    let s = setup().await;
    for h2 in [false, true] {
        let mut raw = s.raw("api.a.test", h2).await;
        for path in [
            "/repos/../admin/x",
            "/repos/%2e%2e/admin/x",
            "/repos/.%2E/admin/x",
        ] {
            let answer = raw
                .send(raw.get("api.a.test", s.port(), path).body(empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(answer.status, 200, "{path}");
            let got = s.log.last();
            assert_eq!(got.path, "/admin/x", "{path} h2={h2}");
            assert!(
                !got.headers.contains_key("authorization"),
                "{path} h2={h2} got the credential"
            );
        }
        let answer = raw
            .send(
                raw.get("api.a.test", s.port(), "/repos/./x")
                    .body(empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(s.log.last().path, "/repos/x");
        assert_eq!(
            s.log.last().headers["authorization"],
            format!("Bearer {SECRET_GH}")
        );
        // What canonical form cannot settle is refused where a credential could attach.
        for path in [
            "/repos/x%2f..%2f..%2fadmin",
            "/repos/..;/admin",
            "/repos/%252e%252e/admin",
        ] {
            let before = s.log.count();
            let answer = raw
                .send(raw.get("api.a.test", s.port(), path).body(empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(answer.status, 400, "{path}");
            assert_eq!(answer.code(), "path_not_canonical");
            assert_eq!(s.log.count(), before);
        }
    }
    s.gw.server.shutdown();
}

/// A workspace rule on a path sees the canonical path: `/repos/./forbidden` is
/// `/repos/forbidden`.
#[tokio::test]
async fn a_workspace_deny_on_a_path_cannot_be_dodged_with_dot_segments() {
    let policy = r#"package sandgate.scopes.workspaces["ws-a"].egress
import rego.v1

allow := true

deny contains "ws-a keeps out of /repos/forbidden" if startswith(input.request.path, "/repos/forbidden")
"#;
    let s = setup_with("", vec![("workspaces/ws-a/egress.rego", policy.into())]).await;
    for h2 in [false, true] {
        let mut raw = s.raw("api.a.test", h2).await;
        for path in [
            "/repos/forbidden",
            "/repos/./forbidden",
            "/repos/x/../forbidden",
            "/repos/%2e/forbidden",
        ] {
            let before = s.log.count();
            let answer = raw
                .send(raw.get("api.a.test", s.port(), path).body(empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(answer.status, 403, "{path} h2={h2}");
            assert_eq!(answer.code(), "egress_denied");
            assert_eq!(s.log.count(), before);
        }
    }
    s.gw.server.shutdown();
}

// ------------------------------------------------------------------ negative paths

/// An origin whose certificate sandgate does not trust is refused: 502, and no request is
/// sent over the connection.
#[tokio::test]
async fn an_upstream_with_an_untrusted_certificate_is_refused() {
    init();
    let ca = TestCa::new();
    let (origin, log) = start_reflector(&ca).await;
    let gw = Gateway::start(GatewayOptions::default()).await; // no upstream_ca
    let response = gw
        .client("sb-a", false)
        .get(format!("https://api.a.test:{}/repos/x", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(response.headers()["x-sandgate-error"], "upstream_failed");
    assert_eq!(log.count(), 0, "a request was sent to an untrusted origin");
    gw.server.shutdown();
}

/// Loopback outside the exempt range (`::1` while only 127.0.0.0/8 is exempt) is refused
/// and never dialed.
#[tokio::test]
async fn loopback_is_refused_unless_allow_private_exempts_it() {
    let s = setup().await;
    let listener = TcpListener::bind("[::1]:0").await;
    let Ok(listener) = listener else {
        eprintln!("no IPv6 loopback here; the refusal is still checked");
        let (status, _) = connect_tunnel(
            s.gw.server.proxy_addr(),
            "loop6.test:443",
            Some(("sb-a", TOKEN)),
        )
        .await
        .err()
        .unwrap();
        assert_eq!(status, 403);
        return;
    };
    let port = listener.local_addr().unwrap().port();
    let (status, text) = connect_tunnel(
        s.gw.server.proxy_addr(),
        &format!("loop6.test:{port}"),
        Some(("sb-a", TOKEN)),
    )
    .await
    .expect_err("refused");
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains("destination_forbidden") && text.contains("loopback"),
        "{text}"
    );
    let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "sandgate dialed ::1");
    s.gw.server.shutdown();
}

/// `basic` and `query` credentials end to end through reqwest (the origin sees exactly what
/// the apply type says, and a sandbox-supplied value in the slot is replaced).
#[tokio::test]
async fn basic_and_query_credentials_are_applied_end_to_end() {
    let s = setup().await;
    let client = s.gw.client("sb-a", false);
    let response = client
        .get(s.url("basic.a.test", "/x"))
        .basic_auth("someone", Some("sandbox-guess"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let want = base64::engine::general_purpose::STANDARD.encode(format!("bot:{SECRET_BASIC}"));
    assert_eq!(
        s.log.last().headers["authorization"],
        format!("Basic {want}")
    );
    let response = client
        .get(s.url("query.a.test", "/x?key=sandbox-guess&a=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        s.log.last().path,
        format!("/x?a=1&key={}", percent_encode(SECRET_QUERY))
    );
    s.gw.server.shutdown();
}

/// A placeholder in its own slot on a request its credential's destination rule does not
/// cover (`gh` is `GET` only, on the origin's port, under `/repos/`): the refusal names the
/// rule that refused it, the method, the port or the path prefix, rather than blaming the
/// slot; it carries neither the secret nor the placeholder, and nothing reaches the origin.
#[tokio::test]
async fn a_credential_refusal_names_the_rule_that_refused_it() {
    let s = setup().await;
    let gh = s.placeholder("sb-a", "gh").await;
    let client = s.gw.client("sb-a", true);
    // A port nothing listens on: the request is refused before anything is dialed.
    let other_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let port = s.port();
    let cases: Vec<(http::Method, String, Vec<String>)> = vec![
        (
            http::Method::POST,
            s.url("api.a.test", "/repos/x"),
            vec![
                "method POST".into(),
                "methods = [\"GET\"]".into(),
                "\"gh\"".into(),
            ],
        ),
        (
            http::Method::GET,
            format!("https://api.a.test:{other_port}/repos/x"),
            vec![
                format!("port {other_port}"),
                format!("ports = [{port}]"),
                "\"gh\"".into(),
            ],
        ),
        (
            http::Method::GET,
            s.url("api.a.test", "/admin/x"),
            vec![
                "path_prefix = \"/repos/\"".into(),
                "path".into(),
                "\"gh\"".into(),
            ],
        ),
    ];
    for (method, url, wanted) in cases {
        let before = s.log.count();
        let response = client
            .request(method.clone(), url.as_str())
            .header("authorization", format!("Bearer {gh}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{method} {url}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(
            body["error"]["code"], "credential_destination_mismatch",
            "{body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        for want in &wanted {
            assert!(
                message.contains(want.as_str()),
                "{method} {url}: {want:?} missing from {message:?}"
            );
        }
        assert!(
            !message.contains("not the declared slot"),
            "{method} {url}: the slot is blamed: {message}"
        );
        let text = body.to_string().to_ascii_lowercase();
        assert!(
            !text.contains(&gh[5..]),
            "the placeholder is echoed: {text}"
        );
        assert!(!text.contains(&SECRET_GH.to_ascii_lowercase()), "{text}");
        assert_eq!(s.log.count(), before, "{method} {url} reached the origin");
    }
    // The rule still lets through what it covers.
    let response = client
        .get(s.url("api.a.test", "/repos/x"))
        .header("authorization", format!("Bearer {gh}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    s.gw.server.shutdown();
}
