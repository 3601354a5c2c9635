//! `sandgate demo`: the whole story in one command, with no network and no account.
//!
//! It starts a gateway in this process on ephemeral ports (everything in a temporary
//! directory: CA, database, bundled policies, local sandboxes), a built-in HTTPS origin
//! for `api.demo.test` and `blocked.demo.test` (both resolved to 127.0.0.1 by the
//! gateway's `[dns] hosts`), creates a local sandbox allowed to reach `api.demo.test` with
//! one bound credential, and runs `curl` inside it: against the allowed origin (which
//! reports the credential it received, while the sandbox saw only a placeholder), against
//! the blocked one (the 403 and its JSON reason), and around the proxy (no route). It
//! prints the decision log lines and deletes everything.

use std::convert::Infallible;
use std::io::Write as _;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};

use crate::config::Config;
use crate::server::Server;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the demo needs local sandboxes, which need root on Linux ({0}); run it with sudo")]
    NotRoot(String),
    #[error("{0}")]
    Setup(String),
    #[error("demo step failed: {0}")]
    Step(String),
}

fn setup(e: impl std::fmt::Display) -> DemoError {
    DemoError::Setup(e.to_string())
}

const API_TOKEN_LEN: usize = 24;

/// Runs the demo; the returned status is the process exit code.
pub async fn run() -> Result<i32, DemoError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(DemoError::NotRoot("not running as root".into()));
    }
    crate::tls::install_default_provider();
    let dir = TempDir::create()?;
    let root = dir.0.as_path();

    step("1. A built-in HTTPS origin for api.demo.test and blocked.demo.test");
    let origin = Origin::start(root).await?;
    println!(
        "   listening on 127.0.0.1:{} (its own test CA)",
        origin.port
    );

    step("2. A gateway with a local pool, a credential and the bundled policies");
    let secret = format!("demo-secret-{}", crate::base::ids::random_hex(6));
    std::fs::write(root.join("demo-key"), &secret).map_err(setup)?;
    let api_token = crate::base::ids::random_hex(API_TOKEN_LEN);
    let decisions = root.join("decisions.jsonl");
    let toml = format!(
        r#"
[proxy]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[[api.tokens]]
token = "{api_token}"
principal = "newcomer"
workspace = "demo"
[tls]
ca_dir = "{root}/certs"
upstream_ca_files = ["{root}/origin-ca.pem"]
[dns.hosts]
"api.demo.test" = "127.0.0.1"
"blocked.demo.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.1/32"]
[policy]
dir = "{root}/policies"
[log]
decisions = "{decisions}"
[store]
path = "{root}/data/sandgate.db"
[secrets]
master_key_file = "{root}/data/master.key"
[local]
dir = "{root}/sandboxes"
snapshot_dir = "{root}/snapshots"
[[credentials]]
workspace = "demo"
name = "demo-key"
secret_file = "{root}/demo-key"
placeholder_env = "DEMO_TOKEN"
destinations = [{{ host = "api.demo.test", ports = [{port}] }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}
"#,
        root = root.display(),
        decisions = decisions.display(),
        port = origin.port,
    );
    let config = Config::from_toml(&toml).map_err(setup)?;
    let server = Server::start(config).await.map_err(setup)?;
    let api = format!("http://{}", server.api_addr());
    println!("   API {api}, proxy {}", server.proxy_addr());
    println!("   credential demo-key = {secret} (held by sandgate, bound to api.demo.test)");

    let http = reqwest::Client::new();
    step("3. Create a sandbox: allowed domain api.demo.test, credential demo-key");
    let response = http
        .post(format!("{api}/v1/sandboxes"))
        .bearer_auth(&api_token)
        .json(&json!({
            "credentials": ["demo-key"],
            "network": {"allow_domains": ["api.demo.test"]},
            "labels": {"purpose": "demo"},
        }))
        .send()
        .await
        .map_err(setup)?;
    let status = response.status();
    let sandbox: Value = response.json().await.map_err(setup)?;
    if status != 201 {
        server.shutdown();
        return Err(DemoError::Step(format!(
            "creating the sandbox answered {status}: {sandbox}"
        )));
    }
    let id = sandbox["id"].as_str().unwrap_or_default().to_string();
    println!(
        "   {id} running on pool {} (instance {}, its own network namespace)",
        sandbox["placement"]["pool"].as_str().unwrap_or("?"),
        sandbox["placement"]["instance_id"].as_str().unwrap_or("?")
    );
    let demo = Demo {
        http: &http,
        api: &api,
        token: &api_token,
        id: &id,
    };

    step("4. What the sandbox sees: a proxy, a CA and a placeholder, never the secret");
    demo.run("env | grep -E '^(HTTPS_PROXY|SSL_CERT_FILE|DEMO_TOKEN)=' | sort")
        .await?;

    step("5. curl the allowed origin with the placeholder in its Authorization header");
    let url = format!("https://api.demo.test:{}/hello", origin.port);
    let (code, _) = demo
        .run(&format!(
            "curl -sS -H \"Authorization: Bearer $DEMO_TOKEN\" {url}; echo"
        ))
        .await?;
    let received = origin
        .received
        .lock()
        .map(|r| r.clone())
        .unwrap_or_default();
    println!("   exit {code}; the origin received: Authorization: {received}");
    let injected = received == format!("Bearer {secret}");
    println!(
        "   => {}",
        if injected {
            "the secret was injected outside the sandbox"
        } else {
            "UNEXPECTED: the origin did not receive the secret"
        }
    );

    step("6. curl a domain the policy does not allow");
    demo.run(&format!(
        "curl -sS https://blocked.demo.test:{}/ ; echo \"exit $?\"; curl -s http://blocked.demo.test:{}/ ; echo",
        origin.port, origin.port
    ))
    .await?;

    step("7. Walk around the proxy with --noproxy: there is no route");
    let (bypass, _) = demo
        .run(&format!(
            "curl -sS --noproxy '*' -m 5 https://127.0.0.1:{}/ ; echo \"exit $?\"",
            origin.port
        ))
        .await?;
    let _ = bypass;

    step("8. The decision log (one JSON line per decision)");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(&decisions).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains(&id)) {
        println!("   {line}");
    }

    step("9. Delete the sandbox: processes, namespace and directory are removed");
    let response = http
        .delete(format!("{api}/v1/sandboxes/{id}"))
        .bearer_auth(&api_token)
        .send()
        .await
        .map_err(setup)?;
    println!("   DELETE /v1/sandboxes/{id} -> {}", response.status());
    server.shutdown();
    drop(dir);
    println!("\nDone. Next: `sandgate serve`, then the Quickstart at the top of README.md.");
    Ok(if injected { 0 } else { 1 })
}

/// The demo's working directory, removed when the demo ends however it ends.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn create() -> Result<TempDir, DemoError> {
        use std::os::unix::fs::DirBuilderExt;
        let path =
            std::env::temp_dir().join(format!("sandgate-demo-{}", crate::base::ids::random_hex(6)));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(setup)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn step(title: &str) {
    println!("\n== {title}");
}

struct Demo<'a> {
    http: &'a reqwest::Client,
    api: &'a str,
    token: &'a str,
    id: &'a str,
}

impl Demo<'_> {
    /// Runs `sh -c script` in the sandbox, echoing the command and its output indented.
    async fn run(&self, script: &str) -> Result<(i64, String), DemoError> {
        println!("   $ {script}");
        let response = self
            .http
            .post(format!("{}/v1/sandboxes/{}/exec", self.api, self.id))
            .bearer_auth(self.token)
            .json(&json!({"argv": ["sh", "-c", script], "timeout_ms": 30000}))
            .send()
            .await
            .map_err(setup)?;
        let status = response.status();
        let text = response.text().await.map_err(setup)?;
        if !status.is_success() {
            return Err(DemoError::Step(format!("exec answered {status}: {text}")));
        }
        // Each stream is cut into whole lines before the two are interleaved: a program may
        // write one line to stderr in several pieces.
        let mut output = String::new();
        let mut partial = [String::new(), String::new()];
        let mut code = -1;
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let stream = match event["type"].as_str() {
                Some("stdout") => 0,
                Some("stderr") => 1,
                Some("exit") => {
                    code = event["code"].as_i64().unwrap_or(-1);
                    continue;
                }
                _ => continue,
            };
            partial[stream].push_str(event["text"].as_str().unwrap_or_default());
            while let Some(end) = partial[stream].find('\n') {
                let line: String = partial[stream].drain(..=end).collect();
                output.push_str(&line);
            }
        }
        for rest in partial.iter().filter(|p| !p.is_empty()) {
            output.push_str(rest);
            output.push('\n');
        }
        for line in output.lines() {
            println!("   | {line}");
        }
        let _ = std::io::stdout().flush();
        Ok((code, output))
    }
}

/// The demo's HTTPS origin: answers every request and remembers the last Authorization
/// header it received (it does not echo it: the sandbox must never see the secret).
struct Origin {
    port: u16,
    received: Arc<Mutex<String>>,
}

impl Origin {
    async fn start(root: &std::path::Path) -> Result<Origin, DemoError> {
        let ca_key = rcgen::KeyPair::generate().map_err(setup)?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(setup)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sandgate demo origin CA");
        let ca_cert = ca_params.self_signed(&ca_key).map_err(setup)?;
        std::fs::write(root.join("origin-ca.pem"), ca_cert.pem()).map_err(setup)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().map_err(setup)?;
        let leaf_params = rcgen::CertificateParams::new(vec![
            "api.demo.test".to_string(),
            "blocked.demo.test".to_string(),
        ])
        .map_err(setup)?;
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).map_err(setup)?;
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca_cert.der().clone()], key)
            .map_err(setup)?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(setup)?;
        let port = listener.local_addr().map_err(setup)?.port();
        let received = Arc::new(Mutex::new(String::new()));
        let seen = received.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let seen = seen.clone();
                            async move {
                                let auth = req
                                    .headers()
                                    .get(http::header::AUTHORIZATION)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("(none)")
                                    .to_string();
                                let carried = auth != "(none)";
                                if let Ok(mut last) = seen.lock() {
                                    *last = auth;
                                }
                                let host = req.uri().host().map(str::to_string).or_else(|| {
                                    req.headers()
                                        .get(http::header::HOST)
                                        .and_then(|h| h.to_str().ok())
                                        .map(|h| h.split(':').next().unwrap_or(h).to_string())
                                });
                                let body = format!(
                                "hello from {}; an Authorization header {} (its value stays with the origin)",
                                host.unwrap_or_default(),
                                if carried { "arrived" } else { "did not arrive" }
                            );
                                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(
                                    body,
                                ))))
                            }
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Origin { port, received })
    }
}
