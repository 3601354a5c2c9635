//! The TLS proxy listener (`[proxy] tls_listen`), the one hosted sandboxes use across a
//! network: the sandbox's proxy credentials travel only inside TLS to sandgate, and inside
//! that the sandbox runs its own TLS to the (intercepted) origin. Real clients: curl
//! (`--proxy https://`), Python `requests` and `urllib3`, git (a clone over smart HTTP), and
//! reqwest; raw sockets for what a client should never get (plain HTTP on the TLS port, an
//! h2-only handshake, a wrong name, a slow handshake); and the configuration errors.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The `[proxy]` keys of a TLS listener with a certificate from sandgate's own CA.
const TLS_PROXY: &str = "tls_listen = \"127.0.0.1:0\"\npublic_name = \"127.0.0.1\"\npublic_url = \"https://127.0.0.1:3129\"\n";

struct Env {
    test_ca: TestCa,
    origin: Origin,
    plain_origin: Origin,
    gw: Gateway,
    /// sandgate's CA, as a sandbox gets it.
    ca_file: PathBuf,
    tls: SocketAddr,
}

impl Env {
    /// `https://sb-a:<token>@127.0.0.1:<tls port>`
    fn proxy(&self, token: &str) -> String {
        format!("https://sb-a:{token}@{}", self.tls)
    }
}

async fn setup(proxy_toml: &str) -> Env {
    init();
    let test_ca = TestCa::new();
    let origin = start_origin(Some(test_ca.server_config(&["api.a.test"]))).await;
    let plain_origin = start_origin(None).await;
    let gw = Gateway::start(GatewayOptions {
        upstream_ca: Some(test_ca.pem_path.clone()),
        proxy_toml: proxy_toml.to_string(),
        identities: vec![IdentitySpec::new(
            "sb-a",
            "ws-a",
            vec!["api.a.test", "plain.test", "self.test"],
        )],
        hosts: vec![
            ("api.a.test", "127.0.0.1"),
            ("api.b.test", "127.0.0.1"),
            ("plain.test", "127.0.0.1"),
            ("self.test", "127.0.0.1"),
        ],
        ..Default::default()
    })
    .await;
    let ca_file = gw.dir.path().join("sandgate-ca.pem");
    std::fs::write(&ca_file, &gw.sandgate_ca_pem).unwrap();
    let tls = gw
        .server
        .proxy_tls_addr()
        .expect("[proxy] tls_listen is set, so there is a TLS listener");
    assert_ne!(tls, gw.server.proxy_addr());
    Env {
        test_ca,
        origin,
        plain_origin,
        gw,
        ca_file,
        tls,
    }
}

/// Whether an external client is here; when it is not, CI fails and elsewhere the test is
/// skipped with a line saying so (`.ci/run` installs them).
fn tool_or_skip(test: &str, what: &str, probe: &[&str]) -> bool {
    let ok = std::process::Command::new(probe[0])
        .args(&probe[1..])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return true;
    }
    if in_ci() {
        panic!(
            "{test} needs {what} (`{}` failed), and CI must not skip it: .ci/run installs it",
            probe.join(" ")
        );
    }
    eprintln!(
        "SKIPPED {test}: {what} is not available (`{}` failed)",
        probe.join(" ")
    );
    false
}

/// A command with no proxy or trust settings inherited from the test's environment (git's
/// `GIT_SSL_CAINFO`, set on some machines, would override the `http.sslCAInfo` a test gives).
fn clean_command(program: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "GIT_SSL_NO_VERIFY",
        "GIT_PROXY_SSL_CAINFO",
    ] {
        command.env_remove(var);
    }
    command.kill_on_drop(true);
    command
}

async fn run(mut command: tokio::process::Command) -> (bool, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the client finished within a minute")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ------------------------------------------------------------------------------- curl

async fn curl(args: &[&str]) -> (bool, String, String) {
    let mut command = clean_command("curl");
    command.args(["-sS", "--max-time", "20"]).args(args);
    run(command).await
}

#[tokio::test]
async fn curl_through_the_tls_proxy() {
    if !tool_or_skip("curl_through_the_tls_proxy", "curl", &["curl", "--version"]) {
        return;
    }
    let env = setup(TLS_PROXY).await;
    let ca = env.ca_file.to_str().unwrap();
    let proxy = env.proxy(TOKEN);

    // TLS to the proxy, CONNECT inside it, then curl's own TLS to the intercepted origin
    // inside the tunnel, over HTTP/1.1 and HTTP/2.
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let url = format!("https://api.a.test:{}/curl-tls", env.origin.port());
        let (ok, stdout, stderr) = curl(&[
            flag,
            "-w",
            "\n%{http_version}",
            "--proxy",
            &proxy,
            "--proxy-cacert",
            ca,
            "--cacert",
            ca,
            &url,
        ])
        .await;
        assert!(ok, "curl {flag}: {stdout} {stderr}");
        let (body, got) = stdout.rsplit_once('\n').unwrap();
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["path"], "/curl-tls");
        assert!(body["headers"].get("proxy-authorization").is_none());
        assert_eq!(got, version, "{flag}");
    }
    assert_eq!(env.origin.count(), 2);

    // An absolute-form http:// request over the TLS listener.
    let url = format!("http://plain.test:{}/absolute", env.plain_origin.port());
    let (ok, stdout, stderr) = curl(&["--proxy", &proxy, "--proxy-cacert", ca, &url]).await;
    assert!(ok, "{stdout} {stderr}");
    let body: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(body["path"], "/absolute");
    assert!(body["headers"].get("proxy-authorization").is_none());

    // The identity comes from Proxy-Authorization: none, or a wrong token, is 407.
    let url = format!("https://api.a.test:{}/anonymous", env.origin.port());
    let anonymous = format!("https://{}", env.tls);
    let wrong = env.proxy("wrong-token-0000");
    for proxy in [&anonymous, &wrong] {
        let (ok, stdout, _) = curl(&[
            "-w",
            "%{http_connect}",
            "--proxy",
            proxy,
            "--proxy-cacert",
            ca,
            "--cacert",
            ca,
            &url,
        ])
        .await;
        assert!(!ok);
        assert_eq!(stdout, "407", "{proxy}");
    }
    // Policy as on the plain listener: sb-a may not reach api.b.test.
    let url = format!("https://api.b.test:{}/denied", env.origin.port());
    let (ok, stdout, _) = curl(&[
        "-w",
        "%{http_connect}",
        "--proxy",
        &proxy,
        "--proxy-cacert",
        ca,
        "--cacert",
        ca,
        &url,
    ])
    .await;
    assert!(!ok);
    assert_eq!(stdout, "403");
    // curl checks the proxy's certificate: with another CA for the proxy it refuses before
    // sending anything (so before the credentials).
    let other = env.test_ca.pem_path.to_str().unwrap();
    let url = format!("https://api.a.test:{}/unverified", env.origin.port());
    let (ok, _, stderr) = curl(&[
        "--proxy",
        &proxy,
        "--proxy-cacert",
        other,
        "--cacert",
        ca,
        &url,
    ])
    .await;
    assert!(!ok, "curl accepted a proxy certificate it cannot verify");
    assert!(
        stderr.contains("SSL") || stderr.contains("certificate"),
        "{stderr}"
    );
    assert_eq!(
        env.origin.count(),
        2,
        "no refused request reached the origin"
    );

    let records = env.gw.decisions(3).await;
    let request = records
        .iter()
        .find(|r| r["phase"] == "request" && r["path"] == "/curl-tls")
        .expect("the request through the TLS listener is logged");
    assert_eq!(request["sandbox"], "sb-a");
    assert_eq!(request["host"], "api.a.test");
    assert_eq!(request["decision"], "allow");
    env.gw.server.shutdown();
}

/// An operator's CA (not sandgate's) and the proxy certificate it issues.
struct OperatorCa {
    pem_path: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl OperatorCa {
    fn new(dir: &Path) -> OperatorCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "operator CA");
        let cert = params.self_signed(&key).unwrap();
        let pem_path = dir.join("operator-ca.pem");
        std::fs::write(&pem_path, cert.pem()).unwrap();
        OperatorCa {
            pem_path,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf for `names` and its key, as PEM (the chain is the leaf alone: clients are given
    /// the operator's CA).
    fn leaf_pem(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName((*n).try_into().unwrap()),
            })
            .collect();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A certificate from the operator's own files (here one issued by an operator CA for
/// `gw.test` and 127.0.0.1), verified by curl with `--proxy-cacert`, and by Python with one
/// bundle holding both CAs.
#[tokio::test]
async fn configured_certificate_files_serve_the_tls_listener() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let issuer = OperatorCa::new(dir.path());
    let (cert_pem, key_pem) = issuer.leaf_pem(&["gw.test", "127.0.0.1"]);
    let cert_file = dir.path().join("proxy.pem");
    let key_file = dir.path().join("proxy.key");
    std::fs::write(&cert_file, &cert_pem).unwrap();
    std::fs::write(&key_file, &key_pem).unwrap();
    let env = setup(&format!(
        "tls_listen = \"127.0.0.1:0\"\ntls_cert_file = {:?}\ntls_key_file = {:?}\npublic_url = \"https://gw.test:3129\"\n",
        cert_file.display().to_string(),
        key_file.display().to_string()
    ))
    .await;

    // The listener serves exactly the configured certificate.
    let stream = tls_to(
        env.tls,
        &std::fs::read(&issuer.pem_path).unwrap(),
        "gw.test",
        &[b"http/1.1"],
    )
    .await
    .expect("the configured certificate verifies for gw.test");
    let served = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    let configured = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(served, configured);
    drop(stream);

    if tool_or_skip(
        "configured_certificate_files_serve_the_tls_listener",
        "curl",
        &["curl", "--version"],
    ) {
        let proxy = format!("https://sb-a:{TOKEN}@gw.test:{}", env.tls.port());
        let resolve = format!("gw.test:{}:127.0.0.1", env.tls.port());
        let url = format!("https://api.a.test:{}/named-proxy", env.origin.port());
        let (ok, stdout, stderr) = curl(&[
            "--resolve",
            &resolve,
            "--proxy",
            &proxy,
            "--proxy-cacert",
            issuer.pem_path.to_str().unwrap(),
            "--cacert",
            env.ca_file.to_str().unwrap(),
            &url,
        ])
        .await;
        assert!(ok, "{stdout} {stderr}");
        let body: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(body["path"], "/named-proxy");
    }
    if tool_or_skip(
        "configured_certificate_files_serve_the_tls_listener",
        "python3 with requests",
        &["python3", "-c", "import requests"],
    ) {
        // requests verifies the proxy and the origin against the one bundle it is given.
        let bundle = dir.path().join("bundle.pem");
        let mut pem = env.gw.sandgate_ca_pem.clone();
        pem.extend(std::fs::read(&issuer.pem_path).unwrap());
        std::fs::write(&bundle, pem).unwrap();
        let mut command = clean_command("python3");
        command
            .arg("-c")
            .arg(
                "import requests, sys\n\
                 r = requests.get(sys.argv[1], timeout=20)\n\
                 assert r.status_code == 200, (r.status_code, r.text)\n\
                 print(r.json()['path'])\n",
            )
            .arg(format!("https://api.a.test:{}/py-named", env.origin.port()))
            .env("HTTPS_PROXY", env.proxy(TOKEN))
            .env("REQUESTS_CA_BUNDLE", &bundle);
        let (ok, stdout, stderr) = run(command).await;
        assert!(ok, "{stdout} {stderr}");
        assert_eq!(stdout.trim(), "/py-named");
    }
    env.gw.server.shutdown();
}

// ----------------------------------------------------------------------------- Python

const PYTHON_CLIENTS: &str = r#"
import json, os, ssl, sys
import requests, urllib3

url, plain, denied, upload = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ca = os.environ["SANDGATE_CA"]
out = {"urllib3": urllib3.__version__, "requests": requests.__version__}

# requests as a sandbox runs it: proxies and the CA bundle from the environment.
r = requests.get(url + "/requests", timeout=20)
out["requests_status"] = r.status_code
out["requests_path"] = r.json()["path"]
out["requests_proxy_auth_seen"] = "proxy-authorization" in r.json()["headers"]
r = requests.get(plain, timeout=20)
out["requests_plain_path"] = r.json()["path"]
# A POST body through both TLS layers.
r = requests.post(upload + "/post", data=b"x" * 100000, timeout=20)
out["post_status"] = r.status_code
out["post_method"] = r.json()["method"]
out["post_length"] = r.json()["length"]
try:
    requests.get(denied, timeout=20)
    out["denied"] = "reached"
except requests.exceptions.ProxyError as e:
    out["denied"] = "403" if "403" in str(e) else str(e)
try:
    bad = os.environ["HTTPS_PROXY"].replace(os.environ["SANDGATE_TOKEN"], "wrong-token-000")
    requests.get(url + "/bad", timeout=20, proxies={"https": bad})
    out["bad_token"] = "reached"
except requests.exceptions.ProxyError as e:
    out["bad_token"] = "407" if "407" in str(e) else str(e)

# urllib3 on its own, with an explicit TLS context for the proxy.
proxy = urllib3.util.parse_url(os.environ["HTTPS_PROXY"])
pm = urllib3.ProxyManager(
    "https://%s:%d" % (proxy.host, proxy.port),
    proxy_headers=urllib3.make_headers(proxy_basic_auth=proxy.auth),
    proxy_ssl_context=ssl.create_default_context(cafile=ca),
    ca_certs=ca,
    cert_reqs="CERT_REQUIRED",
)
r = pm.request("GET", url + "/urllib3")
out["urllib3_status"] = r.status
out["urllib3_path"] = json.loads(r.data)["path"]
print(json.dumps(out))
"#;

#[tokio::test]
async fn python_requests_and_urllib3_through_the_tls_proxy() {
    if !tool_or_skip(
        "python_requests_and_urllib3_through_the_tls_proxy",
        "python3 with requests",
        &["python3", "-c", "import requests, urllib3"],
    ) {
        return;
    }
    let env = setup(TLS_PROXY).await;
    let upload = start_upload_origin(env.test_ca.server_config(&["api.a.test"])).await;
    let mut command = clean_command("python3");
    command
        .arg("-c")
        .arg(PYTHON_CLIENTS)
        .arg(format!("https://api.a.test:{}", env.origin.port()))
        .arg(format!(
            "http://plain.test:{}/py-plain",
            env.plain_origin.port()
        ))
        .arg(format!("https://api.b.test:{}/denied", env.origin.port()))
        .arg(format!("https://api.a.test:{}", upload.port()))
        .env("HTTPS_PROXY", env.proxy(TOKEN))
        .env("HTTP_PROXY", env.proxy(TOKEN))
        .env("REQUESTS_CA_BUNDLE", &env.ca_file)
        .env("SANDGATE_CA", &env.ca_file)
        .env("SANDGATE_TOKEN", TOKEN);
    let (ok, stdout, stderr) = run(command).await;
    assert!(ok, "{stdout} {stderr}");
    let out: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout} {stderr}"));
    eprintln!("python clients: {out}");
    assert_eq!(out["requests_status"], 200);
    assert_eq!(out["requests_path"], "/requests");
    assert_eq!(out["requests_proxy_auth_seen"], false);
    assert_eq!(out["requests_plain_path"], "/py-plain");
    assert_eq!(out["post_status"], 200);
    assert_eq!(out["post_method"], "POST");
    assert_eq!(
        out["post_length"], 100000,
        "the whole body crossed both TLS layers"
    );
    assert_eq!(out["denied"], "403");
    assert_eq!(out["bad_token"], "407");
    assert_eq!(out["urllib3_status"], 200);
    assert_eq!(out["urllib3_path"], "/urllib3");
    env.gw.server.shutdown();
}

/// A TLS origin that reads each request's whole body before answering with its method,
/// path and body length. (The shared test origin answers without reading the body, so a
/// large upload races its own answer: the proxy closes the client's connection once the
/// answer is sent with the body unread, and a client still writing sees a reset.)
async fn start_upload_origin(tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let (parts, body) = req.into_parts();
                        let length = body.collect().await.map_or(0, |b| b.to_bytes().len());
                        let json = serde_json::json!({
                            "method": parts.method.as_str(), "path": parts.uri.path(), "length": length,
                        });
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(json.to_string()),
                        )))
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

// -------------------------------------------------------------------------------- git

/// A git smart-HTTP origin over TLS: each request runs `git http-backend` as a CGI.
async fn start_git_origin(tls: Arc<rustls::ServerConfig>, root: PathBuf) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (tls, root) = (tls.clone(), root.clone());
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let root = root.clone();
                    async move { Ok::<_, std::convert::Infallible>(git_cgi(&root, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn git_cgi(
    root: &Path,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", parts.uri.path())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("HTTP_GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = child.wait_with_output().await.unwrap();
    writer.await.unwrap();
    let out = output.stdout;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)))
        .expect("a CGI header block");
    let head = String::from_utf8_lossy(&out[..split.0]).into_owned();
    let mut response = http::Response::builder();
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("status") {
            let code: u16 = value.trim()[..3].parse().unwrap();
            response = response.status(code);
        } else {
            response = response.header(name.trim(), value.trim());
        }
    }
    response
        .body(Full::new(Bytes::copy_from_slice(&out[split.0 + split.1..])))
        .unwrap()
}

fn git_in(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn git_clone_through_the_tls_proxy() {
    if !tool_or_skip(
        "git_clone_through_the_tls_proxy",
        "git",
        &["git", "--version"],
    ) {
        return;
    }
    let env = setup(TLS_PROXY).await;
    // A repository with one commit, published bare under the origin's project root.
    let work = tempfile::tempdir().unwrap();
    let source = work.path().join("source");
    std::fs::create_dir_all(&source).unwrap();
    git_in(&source, &["init", "-q", "-b", "main"]);
    std::fs::write(source.join("hello.txt"), "through two TLS layers\n").unwrap();
    git_in(&source, &["add", "hello.txt"]);
    git_in(
        &source,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "first",
        ],
    );
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    git_in(
        work.path(),
        &[
            "clone",
            "-q",
            "--bare",
            source.to_str().unwrap(),
            root.join("repo.git").to_str().unwrap(),
        ],
    );
    let git_origin =
        start_git_origin(env.test_ca.server_config(&["api.a.test"]), root.clone()).await;
    let url = format!("https://api.a.test:{}/repo.git", git_origin.port());
    let ca = env.ca_file.to_str().unwrap().to_string();
    let git = |args: Vec<String>| {
        let mut command = clean_command("git");
        command
            .current_dir(work.path())
            .arg("-c")
            .arg(format!("http.proxy={}", env.proxy(TOKEN)))
            .arg("-c")
            .arg(format!("http.proxySSLCAInfo={ca}"))
            .arg("-c")
            .arg(format!("http.sslCAInfo={ca}"))
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("HOME", work.path());
        command
    };

    let (ok, stdout, stderr) = run(git(vec!["ls-remote".into(), url.clone()])).await;
    assert!(ok, "git ls-remote: {stdout} {stderr}");
    assert!(stdout.contains("refs/heads/main"), "{stdout}");

    let dest = work.path().join("clone");
    let (ok, stdout, stderr) = run(git(vec![
        "clone".into(),
        "-q".into(),
        url.clone(),
        dest.display().to_string(),
    ]))
    .await;
    assert!(ok, "git clone: {stdout} {stderr}");
    assert_eq!(
        std::fs::read_to_string(dest.join("hello.txt")).unwrap(),
        "through two TLS layers\n"
    );
    // The pack came through the proxy: its upload-pack POST is in the decision log.
    let records = env.gw.decisions(2).await;
    assert!(
        records.iter().any(|r| r["phase"] == "request"
            && r["method"] == "POST"
            && r["path"] == "/repo.git/git-upload-pack"
            && r["sandbox"] == "sb-a"
            && r["decision"] == "allow"),
        "{records:?}"
    );
    // With the wrong token git is refused at the proxy.
    let mut command = clean_command("git");
    command
        .current_dir(work.path())
        .arg("-c")
        .arg(format!("http.proxy={}", env.proxy("wrong-token-000")))
        .arg("-c")
        .arg(format!("http.proxySSLCAInfo={ca}"))
        .arg("-c")
        .arg(format!("http.sslCAInfo={ca}"))
        .args(["ls-remote", &url])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("HOME", work.path());
    let (ok, _, stderr) = run(command).await;
    assert!(!ok);
    assert!(stderr.contains("407"), "{stderr}");
    env.gw.server.shutdown();
}

// ----------------------------------------------------------------------------- reqwest

#[tokio::test]
async fn reqwest_through_the_tls_proxy_over_h1_and_h2() {
    let env = setup(TLS_PROXY).await;
    for (http1_only, expected) in [
        (true, reqwest::Version::HTTP_11),
        (false, reqwest::Version::HTTP_2),
    ] {
        let mut builder = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(env.proxy(TOKEN)).unwrap())
            .tls_certs_only([reqwest::Certificate::from_pem(&env.gw.sandgate_ca_pem).unwrap()])
            .timeout(Duration::from_secs(10));
        if http1_only {
            builder = builder.http1_only();
        }
        let response = builder
            .build()
            .unwrap()
            .get(format!("https://api.a.test:{}/reqwest", env.origin.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.version(), expected);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["path"], "/reqwest");
    }
    env.gw.server.shutdown();
}

// ---------------------------------------------------------------------------- raw side

/// TLS to `addr` trusting `ca_pem`, verifying `name`, offering `alpn`.
async fn tls_to(
    addr: SocketAddr,
    ca_pem: &[u8],
    name: &str,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let stream = TcpStream::connect(addr).await?;
    tls_client(stream, ca_pem, name, alpn).await
}

async fn tls_client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    ca_pem: &[u8],
    name: &str,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<S>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(name.to_string()).unwrap(), stream)
        .await
}

/// Sends a CONNECT (with sb-a's credentials when `token` is given) on `stream` and reads the
/// answer's head and body.
async fn connect_on<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    authority: &str,
    token: Option<&str>,
) -> (u16, String) {
    use base64::Engine as _;
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(token) = token {
        let enc = base64::engine::general_purpose::STANDARD.encode(format!("sb-a:{token}"));
        head.push_str(&format!("Proxy-Authorization: Basic {enc}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.unwrap();
        assert!(
            n > 0,
            "proxy closed during the CONNECT answer: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let status: u16 = text[9..12].parse().unwrap();
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
    (status, format!("{text}{}", String::from_utf8_lossy(&body)))
}

/// Everything the peer sends until it closes (or 5 s pass).
async fn read_to_close<S: AsyncRead + Unpin>(stream: &mut S) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (got, closed)
}

/// A raw CONNECT through the TLS listener, then TLS inside it: the double TLS by hand.
#[tokio::test]
async fn tls_inside_tls_by_hand() {
    let env = setup(TLS_PROXY).await;
    let ca = env.gw.sandgate_ca_pem.clone();
    let mut outer = tls_to(env.tls, &ca, "127.0.0.1", &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(outer.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let authority = format!("api.a.test:{}", env.origin.port());
    let (status, text) = connect_on(&mut outer, &authority, Some(TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    let mut inner = tls_client(outer, &ca, "api.a.test", &[b"http/1.1"])
        .await
        .unwrap();
    inner
        .write_all(b"GET /by-hand HTTP/1.1\r\nHost: api.a.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (got, closed) = read_to_close(&mut inner).await;
    assert!(closed);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"/by-hand\""), "{text}");
    env.gw.server.shutdown();
}

/// The TLS port speaks only TLS: a plain-text CONNECT (credentials in clear, as a client
/// configured with `http://` for this port would send them) gets no proxy answer and opens
/// nothing; a handshake that insists on h2 is refused (sandgate speaks HTTP/1.1 to proxy
/// clients); the certificate is valid for the public name only; and the listener is
/// "sandgate itself" to the address guard.
#[tokio::test]
async fn the_tls_port_speaks_only_tls() {
    let env = setup(TLS_PROXY).await;
    let ca = env.gw.sandgate_ca_pem.clone();
    let authority = format!("api.a.test:{}", env.origin.port());

    let mut raw = TcpStream::connect(env.tls).await.unwrap();
    use base64::Engine as _;
    let enc = base64::engine::general_purpose::STANDARD.encode(format!("sb-a:{TOKEN}"));
    raw.write_all(
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: Basic {enc}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (got, closed) = read_to_close(&mut raw).await;
    assert!(closed, "the TLS port kept a plain-text client open");
    assert!(
        !got.starts_with(b"HTTP/"),
        "the TLS port answered plain HTTP: {:?}",
        String::from_utf8_lossy(&got)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        env.origin
            .connections
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    let log = std::fs::read_to_string(&env.gw.decision_log).unwrap_or_default();
    assert!(
        !log.contains("\"phase\":\"connect\""),
        "a plain-text CONNECT was handled: {log}"
    );

    // ALPN: http/1.1 or none; h2 alone is refused at the handshake.
    let none = tls_to(env.tls, &ca, "127.0.0.1", &[]).await.unwrap();
    assert_eq!(none.get_ref().1.alpn_protocol(), None);
    drop(none);
    let h2 = tls_to(env.tls, &ca, "127.0.0.1", &[b"h2"]).await;
    assert!(h2.is_err(), "an h2-only client was accepted");
    let both = tls_to(env.tls, &ca, "127.0.0.1", &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    drop(both);

    // Issued for the public name (127.0.0.1) by sandgate's CA, and for nothing else.
    let other = tls_to(env.tls, &ca, "gw.example.com", &[b"http/1.1"]).await;
    assert!(
        other.is_err(),
        "the listener's certificate verified for another name"
    );
    let stream = tls_to(env.tls, &ca, "127.0.0.1", &[b"http/1.1"])
        .await
        .unwrap();
    let chain = stream.get_ref().1.peer_certificates().unwrap().to_vec();
    drop(stream);
    let sandgate_ca = rustls_pemfile::certs(&mut &ca[..]).next().unwrap().unwrap();
    assert_eq!(chain.last(), Some(&sandgate_ca), "served with its chain");

    // The listener is one of sandgate's own addresses: not a destination, through either
    // listener, even with loopback exempt.
    for via_tls in [true, false] {
        let authority = format!("self.test:{}", env.tls.port());
        let (status, text) = if via_tls {
            let mut s = tls_to(env.tls, &ca, "127.0.0.1", &[b"http/1.1"])
                .await
                .unwrap();
            connect_on(&mut s, &authority, Some(TOKEN)).await
        } else {
            let mut s = TcpStream::connect(env.gw.server.proxy_addr())
                .await
                .unwrap();
            connect_on(&mut s, &authority, Some(TOKEN)).await
        };
        assert_eq!(status, 403, "{text}");
        assert!(text.contains("destination_forbidden"), "{text}");
    }
    env.gw.server.shutdown();
}

/// The TLS listener shares the proxy's limits: a connection holds its `max_connections`
/// place from accept, through the handshake (bounded by `tls_handshake_timeout_secs`) and the
/// request head (bounded by `header_read_timeout_secs`); at the limit the answer is 503
/// `overloaded`, over TLS.
#[tokio::test]
async fn tls_listener_limits_and_timeouts() {
    let env = setup(&format!(
        "{TLS_PROXY}max_connections = 1\ntls_handshake_timeout_secs = 1\nheader_read_timeout_secs = 1\n"
    ))
    .await;
    let ca = env.gw.sandgate_ca_pem.clone();
    let authority = format!("api.a.test:{}", env.origin.port());

    // A client that never starts its handshake holds the one place...
    let started = Instant::now();
    let mut idle = TcpStream::connect(env.tls).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut second = tls_to(env.tls, &ca, "127.0.0.1", &[b"http/1.1"])
        .await
        .expect("a shed connection still completes its handshake");
    let (status, text) = connect_on(&mut second, &authority, Some(TOKEN)).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("overloaded"), "{text}");
    // ...until the handshake timeout closes it.
    let (_, closed) = read_to_close(&mut idle).await;
    assert!(closed, "a silent client outlived the handshake timeout");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "{waited:?}"
    );

    // A client that completes the handshake but sends no request head is closed after the
    // header-read timeout, and its place is free again.
    let mut silent = tls_to(env.tls, &ca, "127.0.0.1", &[b"http/1.1"])
        .await
        .unwrap();
    let started = Instant::now();
    let (_, closed) = read_to_close(&mut silent).await;
    assert!(closed, "a client that sent no request head stayed open");
    assert!(started.elapsed() < Duration::from_secs(4));
    drop(silent);

    // Failed handshakes (an h2-only client, plain text) give the one place back at once.
    assert!(tls_to(env.tls, &ca, "127.0.0.1", &[b"h2"]).await.is_err());
    let mut garbage = TcpStream::connect(env.tls).await.unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let (_, closed) = read_to_close(&mut garbage).await;
    assert!(closed, "a plain-text client stayed open");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut ok = tls_to(env.tls, &ca, "127.0.0.1", &[b"http/1.1"])
        .await
        .unwrap();
    let (status, text) = connect_on(&mut ok, &authority, Some(TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    env.gw.server.shutdown();
}

// ----------------------------------------------------------------------------- config

/// The gateway's start error for `[proxy]` keys `proxy_toml`.
async fn start_error(proxy_toml: &str) -> String {
    match Gateway::try_start(GatewayOptions {
        proxy_toml: proxy_toml.to_string(),
        ..Default::default()
    })
    .await
    {
        Ok(gw) => {
            gw.server.shutdown();
            panic!("started with {proxy_toml:?}")
        }
        Err(e) => e,
    }
}

/// Each misconfiguration of the TLS listener is a start-up error naming its key (or file),
/// never a listener that comes up without a certificate or with another key's.
#[tokio::test]
async fn tls_listener_config_errors_name_the_key() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let issuer = OperatorCa::new(dir.path());
    let (cert_pem, key_pem) = issuer.leaf_pem(&["gw.test"]);
    let (_, other_key_pem) = issuer.leaf_pem(&["gw.test"]);
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (cert, key, other_key) = (
        file("proxy.pem", &cert_pem),
        file("proxy.key", &key_pem),
        file("other.key", &other_key_pem),
    );
    let missing = dir.path().join("missing.pem").display().to_string();
    let listen = "tls_listen = \"127.0.0.1:0\"\n";
    let cases = [
        (listen.to_string(), "proxy.public_name"),
        (format!("{listen}tls_cert_file = {cert:?}\n"), "proxy.tls_key_file"),
        (format!("{listen}tls_key_file = {key:?}\n"), "proxy.tls_cert_file"),
        (
            format!("{listen}tls_cert_file = {cert:?}\ntls_key_file = {key:?}\npublic_name = \"gw.test\"\n"),
            "proxy.public_name",
        ),
        ("public_name = \"gw.test\"\n".to_string(), "has no effect without proxy.tls_listen"),
        (format!("{listen}public_name = \"not a name\"\n"), "proxy.public_name"),
        (format!("{listen}public_url = \"https://gw.test:3129/proxy\"\n"), "proxy.public_url"),
        (format!("{listen}public_url = \"https://gw.test\"\n"), "explicit port"),
        (format!("{listen}public_url = \"https://u:p@gw.test:3129\"\n"), "credentials"),
        (format!("{listen}public_url = \"ftp://gw.test:21\"\n"), "proxy.public_url"),
        (
            format!("{listen}public_name = \"gw.test\"\ntls_handshake_timeout_secs = 0\n"),
            "proxy.tls_handshake_timeout_secs",
        ),
        (
            format!("{listen}tls_cert_file = {missing:?}\ntls_key_file = {key:?}\n"),
            "missing.pem",
        ),
        (
            format!("{listen}tls_cert_file = {key:?}\ntls_key_file = {key:?}\n"),
            "no PEM certificate",
        ),
        (
            format!("{listen}tls_cert_file = {cert:?}\ntls_key_file = {cert:?}\n"),
            "no PEM private key",
        ),
        (
            format!("{listen}tls_cert_file = {cert:?}\ntls_key_file = {other_key:?}\n"),
            "is not the private key",
        ),
    ];
    for (toml, expected) in cases {
        let error = start_error(&toml).await;
        assert!(
            error.contains(expected),
            "{toml:?}: {expected:?} not in {error}"
        );
    }
}
