//! Ports through the gateway (issue 31, item 4): what a local sandbox serves on its own
//! loopback, reached from outside as `https://{port}-{id}.{domain}` through the ports
//! listener, with real clients (curl, reqwest, the official E2B Python SDK via httpx)
//! trusting only the gateway's CA. The action policy decides each request (operation
//! `ports`): a port needs its token unless the workspace lists it public; hostile names
//! (another sandbox in `Host` than in the TLS server name, ports 0 and 99999, unknown
//! sandboxes, garbage) are refused by name.
//!
//! Needs root, as every local sandbox (`local_provider::start` decides and skips).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;
use crate::local_provider::{start, Env, TOKEN_A};

/// An HTTP server for the sandbox: each GET answers its path and the request's headers
/// (lower-cased), so a test sees what the gateway forwarded.
const ECHO_SERVER: &str = r#"
import http.server, sys
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        lines = ["path=" + self.path] + ["%s: %s" % (k.lower(), v) for k, v in self.headers.items()]
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"#;

/// A WebSocket echo server for the sandbox (the standard library has none): the opening
/// handshake, then each short text frame sent back unmasked, until a close frame.
const WEBSOCKET_SERVER: &str = r#"
import base64, hashlib, socket, sys
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def exactly(c, n):
    data = b""
    while len(data) < n:
        more = c.recv(n - len(data))
        if not more:
            raise EOFError
        data += more
    return data
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
while True:
    c, _ = s.accept()
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    try:
        while True:
            first, second = exactly(c, 2)
            mask = exactly(c, 4)
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(exactly(c, second & 127)))
            if first & 15 == 8:
                break
            c.sendall(bytes([0x81, len(payload)]) + payload)
    except EOFError:
        pass
    c.close()
"#;

/// Closes port 9000 for everyone, as a deployment's own action policy would.
const CLOSE_9000: &str = r#"package sandgate.action

import rego.v1

deny contains "the ports test closes port 9000" if {
	input.operation == "ports"
	input.port.number == 9000
}
"#;

/// Starts the echo server on `port` in the background of sandbox `id`.
async fn serve_echo(env: &Env, id: &str, port: u16) {
    serve(env, id, ECHO_SERVER, port).await
}

/// Starts the Python `server` on `port` in the background of sandbox `id`.
async fn serve(env: &Env, id: &str, server: &str, port: u16) {
    let script = format!(
        "cat > /tmp/server-{port}.py <<'EOF'\n{server}\nEOF\nnohup python3 /tmp/server-{port}.py {port} >/tmp/server-{port}.log 2>&1 &"
    );
    let response = env
        .exec_request(
            TOKEN_A,
            id,
            json!({"argv": ["sh", "-c", script], "timeout_ms": 20000}),
        )
        .await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.contains("\"code\":0"), "{text}");
}

/// `GET /v1/sandboxes/{id}/ports/{port}`: status and body.
async fn port_access(env: &Env, token: &str, id: &str, port: &str) -> (u16, Value) {
    let response = env
        .http
        .get(env.gw.api(&format!("/v1/sandboxes/{id}/ports/{port}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// A client of the ports listener trusting only the gateway's CA, resolving `host` (no
/// port) to the listener.
fn client(env: &Env, host: &str) -> reqwest::Client {
    let listener = env
        .gw
        .server
        .ports_addr()
        .expect("the ports gateway serves");
    reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(&env.gw.sandgate_ca_pem).unwrap()])
        .resolve(host, listener)
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
}

/// `GET https://{host}:{listener}{path}` with `headers`: status and body.
async fn fetch(env: &Env, host: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let listener = env.gw.server.ports_addr().unwrap();
    let mut request = client(env, host).get(format!("https://{host}:{}{path}", listener.port()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// Fetches until the server in the sandbox answers 200 (it is starting): its body.
async fn until_served(env: &Env, host: &str, headers: &[(&str, &str)]) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = fetch(env, host, "/hello?x=1", headers).await;
        if status == 200 {
            return body;
        }
        assert_eq!(
            status, 502,
            "only `port_closed` while the server starts: {body}"
        );
        assert!(body.contains("port_closed"), "{body}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "not served within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn error_code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

/// curl, as a user would run it: `--cacert` the gateway's CA, the name resolved to the
/// listener; (status, body).
async fn curl(env: &Env, url: &str, headers: &[&str]) -> (u16, String) {
    curl_with(env, url, headers, &[]).await
}

/// [`curl`] with more of its arguments.
async fn curl_with(env: &Env, url: &str, headers: &[&str], args: &[&str]) -> (u16, String) {
    let text = curl_out(
        env,
        &[url],
        headers,
        &[&["-w", "\n%{http_code}"], args].concat(),
    )
    .await;
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

/// curl fetching `urls` in turn (one connection when it can), `-w write_out` after each:
/// its standard output.
async fn curl_out(env: &Env, urls: &[&str], headers: &[&str], args: &[&str]) -> String {
    let listener: SocketAddr = env.gw.server.ports_addr().unwrap();
    let host = urls[0]
        .trim_start_matches("https://")
        .split(['/', ':'])
        .next()
        .unwrap()
        .to_string();
    let ca = env.gw.dir.path().join("ports-ca.pem");
    std::fs::write(&ca, &env.gw.sandgate_ca_pem).unwrap();
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["-sS", "--noproxy", "*", "--max-time", "15", "--cacert"])
        .arg(&ca)
        .arg("--resolve")
        .arg(format!("{host}:{}:127.0.0.1", listener.port()))
        .args(args);
    for header in headers {
        command.args(["-H", header]);
    }
    let out = command.args(urls).output().await.expect("curl runs");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The `sandgate` binary against the test's gateway, as `TOKEN_A`.
async fn cli(env: &Env, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .env("SANDGATE_URL", env.gw.api(""))
        .env("SANDGATE_TOKEN", TOKEN_A)
        .output()
        .await
        .unwrap()
}

fn public_ports_declared(pools: &Value) -> Option<bool> {
    let local = pools["pools"]
        .as_array()?
        .iter()
        .find(|p| p["pool"] == "local")?;
    let features = local["capabilities"]["features"].as_object()?;
    features
        .iter()
        .find(|(k, _)| k.ends_with("public_ports"))
        .and_then(|(_, v)| v.as_bool())
}

#[tokio::test]
async fn a_port_is_reached_through_its_url_and_refused_without_authorization() {
    let data = json!({"sandgate": {"workspaces": {"ws-a": {"public_ports": [8001]}}}});
    let policies = vec![
        ("data.json", data.to_string()),
        ("ports_close_9000.rego", CLOSE_9000.to_string()),
    ];
    let Some(env) = start("ports_url", policies).await else {
        return;
    };
    let pools = env.gw.api_json("/v1/pools", TOKEN_A).await;
    assert_eq!(public_ports_declared(&pools), Some(true), "{pools:#}");
    let id = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let other = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();

    let (status, access) = port_access(&env, TOKEN_A, &id, "8000").await;
    assert_eq!(status, 200, "{access:#}");
    let listener = env.gw.server.ports_addr().unwrap().port();
    let host = format!("8000-{id}.sandgate.localhost");
    assert_eq!(access["url"], format!("https://{host}:{listener}"));
    assert_eq!(access["host"], format!("{host}:{listener}"));
    assert_eq!(access["public"], false);
    let token = access["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("sgp_"), "{access}");

    // Before anything listens: 502 port_closed; then the server's answer, with the token.
    serve_echo(&env, &id, 8000).await;
    let with_token = [("x-sandgate-port-token", token.as_str())];
    let echoed = until_served(&env, &host, &with_token).await;
    assert!(echoed.starts_with("path=/hello?x=1\n"), "{echoed}");
    assert!(echoed.contains("x-forwarded-proto: https"), "{echoed}");
    assert!(
        echoed.contains(&format!("host: {host}:{listener}")),
        "{echoed}"
    );
    assert!(
        !echoed.contains(&token),
        "the token is never forwarded: {echoed}"
    );

    // curl, as a user would.
    let url = access["url"].as_str().unwrap();
    let header = format!("X-Sandgate-Port-Token: {token}");
    let (code, body) = curl(&env, &format!("{url}/from-curl"), &[&header]).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("path=/from-curl\n"), "{body}");
    // An absolute-form target is taken only for the same port, and forwarded in origin form.
    let absolute = format!("{url}/absolute?x=2");
    let (code, body) = curl_with(&env, url, &[&header], &["--request-target", &absolute]).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("path=/absolute?x=2\n"), "{body}");
    let elsewhere = format!("https://8000-{other}.sandgate.localhost:{listener}/");
    let (code, body) = curl_with(&env, url, &[&header], &["--request-target", &elsewhere]).await;
    assert_eq!(
        (code, error_code(&body).as_str()),
        (421, "misdirected"),
        "{body}"
    );

    // The server speaks HTTP/1.0 (it closes after each answer); the client's connection
    // is a hop of its own and stays open.
    let (one, two) = (format!("{url}/one"), format!("{url}/two"));
    let connects = curl_out(&env, &[&one, &two], &[&header], &["-w", "|%{num_connects}"]).await;
    let connects: Vec<String> = connects
        .split('|')
        .skip(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect())
        .collect();
    assert_eq!(connects, ["1", "0"], "one connection for both requests");
    let (code, body) = curl(&env, url, &[]).await;
    assert_eq!(code, 401, "{body}");
    assert_eq!(error_code(&body), "port_token_required");
    assert!(body.contains("is not public"), "{body}");
    // Anyone may ask: the policy's reasons (here naming the workspace) are not told.
    assert!(!body.contains("ws-a"), "{body}");

    // The CLI prints the same URL (`-q`: only it) and, as a table, the token.
    let out = cli(&env, &["sandbox", "port", &id, "8000", "-q"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), url);
    let out = cli(&env, &["sandbox", "port", &id, "8000", "-o", "table"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with("URL") && table.contains(&token),
        "{table}"
    );
    let out = cli(&env, &["sandbox", "port", &id, "9000"]).await;
    assert_eq!(out.status.code(), Some(1), "refused by policy");
    assert!(String::from_utf8_lossy(&out.stderr).contains("policy_denied"));

    // E2B's header works too; a token of another port or another sandbox does not.
    let (status, _) = fetch(&env, &host, "/", &[("e2b-traffic-access-token", &token)]).await;
    assert_eq!(status, 200);
    let (_, access_8001) = port_access(&env, TOKEN_A, &id, "8001").await;
    let (_, access_other) = port_access(&env, TOKEN_A, &other, "8000").await;
    for wrong in [&access_8001["token"], &access_other["token"]] {
        let wrong = wrong.as_str().unwrap();
        let (status, body) = fetch(&env, &host, "/", &[("x-sandgate-port-token", wrong)]).await;
        assert_eq!(
            (status, error_code(&body).as_str()),
            (401, "port_token_invalid"),
            "{body}"
        );
    }
    let (status, body) = fetch(&env, &host, "/", &[("x-sandgate-port-token", "sgp_guess")]).await;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (401, "port_token_invalid"),
        "{body}"
    );

    // A port the workspace lists public answers without a token.
    assert_eq!(access_8001["public"], true, "{access_8001}");
    serve_echo(&env, &id, 8001).await;
    let public_host = format!("8001-{id}.sandgate.localhost");
    let echoed = until_served(&env, &public_host, &[]).await;
    assert!(echoed.starts_with("path=/hello?x=1\n"), "{echoed}");

    // A port the policy closes: 403 with its reason, and not to another workspace at all.
    let (status, refused) = port_access(&env, TOKEN_A, &id, "9000").await;
    assert_eq!(status, 403, "{refused:#}");
    assert_eq!(refused["error"]["code"], "policy_denied");
    let reasons = refused["error"]["details"]["reasons"].to_string();
    assert!(reasons.contains("closes port 9000"), "{refused:#}");
    let (status, _) = port_access(&env, "api-token-ws-b-local-0123456789", &id, "8000").await;
    assert_eq!(status, 404);
    for bad in ["0", "65536", "http"] {
        let (status, body) = port_access(&env, TOKEN_A, &id, bad).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_port"))
        );
    }

    // Every request was a decision of the action layer, logged; never with a token.
    let records = env
        .gw
        .log_records(6, |r| {
            r["kind"] == "policy" && r["input"]["operation"] == "ports"
        })
        .await;
    let decided = |number: u64, public: bool, allowed: bool| {
        records.iter().any(|r| {
            r["input"]["port"]["number"] == number
                && r["input"]["port"]["public"] == public
                && r["result"]["allow"] == allowed
        })
    };
    assert!(decided(8000, false, true), "{records:#?}");
    assert!(decided(8000, true, false), "{records:#?}");
    assert!(decided(8001, true, true), "{records:#?}");
    assert!(decided(9000, false, false), "{records:#?}");
    let log = std::fs::read_to_string(&env.gw.decision_log).unwrap();
    assert!(
        !log.contains(&token),
        "a port token reached the decision log"
    );
    let forwarded = env
        .gw
        .metric("sandgate_port_requests_total{outcome=\"forwarded\"}")
        .await;
    assert!(forwarded >= 4.0, "{forwarded}");
}

#[tokio::test]
async fn hostile_names_are_refused_by_name() {
    let Some(env) = start("ports_hostile", vec![]).await else {
        return;
    };
    let a = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    serve_echo(&env, &a, 8000).await;
    let (_, access) = port_access(&env, TOKEN_A, &a, "8000").await;
    let token = access["token"].as_str().unwrap().to_string();
    let host_a = format!("8000-{a}.sandgate.localhost");
    until_served(&env, &host_a, &[("x-sandgate-port-token", &token)]).await;

    // The TLS server name names sandbox A, the Host header sandbox B (or A's other port):
    // one connection serves one port of one sandbox.
    let listener = env.gw.server.ports_addr().unwrap().port();
    for other in [
        format!("8000-{b}.sandgate.localhost"),
        format!("8001-{a}.sandgate.localhost"),
    ] {
        let response = client(&env, &host_a)
            .get(format!("https://{host_a}:{listener}/"))
            .header("host", format!("{other}:{listener}"))
            .header("x-sandgate-port-token", &token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 421, "{other}");
        assert_eq!(error_code(&response.text().await.unwrap()), "misdirected");
    }
    let response = client(&env, &host_a)
        .get(format!("https://{host_a}:{listener}/"))
        .header("host", "x".repeat(4000))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(error_code(&response.text().await.unwrap()), "invalid_host");

    // Names that are no port of a sandbox.
    for (host, status, code) in [
        (format!("0-{a}.sandgate.localhost"), 400, "invalid_host"),
        (format!("99999-{a}.sandgate.localhost"), 400, "invalid_host"),
        (format!("08000-{a}.sandgate.localhost"), 400, "invalid_host"),
        (
            "garbage.sandgate.localhost".to_string(),
            400,
            "invalid_host",
        ),
        (
            "8000-sb-000000000000000000000000.sandgate.localhost".to_string(),
            404,
            "not_found",
        ),
    ] {
        let (got, body) = fetch(&env, &host, "/", &[("x-sandgate-port-token", &token)]).await;
        assert_eq!(
            (got, error_code(&body).as_str()),
            (status, code),
            "{host}: {body}"
        );
    }

    // No server name at all (an IP literal): refused, not guessed.
    let by_ip = reqwest::Client::builder()
        .no_proxy()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap()
        .get(format!("https://127.0.0.1:{listener}/"))
        .header("host", format!("{host_a}:{listener}"))
        .send()
        .await
        .unwrap();
    assert_eq!(by_ip.status(), 421);
    let refused = env
        .gw
        .metric("sandgate_port_requests_total{outcome=\"bad_request\"}")
        .await;
    assert!(refused >= 7.0, "{refused}");
}

/// A WebSocket through the ports gateway: the 101 comes back, then frames both ways over
/// the spliced connection.
#[tokio::test]
async fn a_websocket_upgrade_is_spliced_both_ways() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let Some(env) = start("ports_websocket", vec![]).await else {
        return;
    };
    let id = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    serve(&env, &id, WEBSOCKET_SERVER, 8002).await;
    let (_, access) = port_access(&env, TOKEN_A, &id, "8002").await;
    let token = access["token"].as_str().unwrap();
    let host = format!("8002-{id}.sandgate.localhost");
    let listener = env.gw.server.ports_addr().unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut env.gw.sandgate_ca_pem.as_slice()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut ws = loop {
        let tcp = tokio::net::TcpStream::connect(listener).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(host.clone()).unwrap();
        let stream = connector.connect(name, tcp).await.unwrap();
        let url = format!("wss://{host}:{}/socket", listener.port());
        let mut request =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
                .unwrap();
        request
            .headers_mut()
            .insert("x-sandgate-port-token", token.parse().unwrap());
        match tokio_tungstenite::client_async(request, stream).await {
            Ok((ws, response)) => {
                assert_eq!(response.status(), 101);
                break ws;
            }
            // 502 `port_closed` while the server starts.
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for text in ["first", "second frame"] {
        ws.send(Message::Text(text.into())).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an answer within 10 s")
            .unwrap()
            .unwrap();
        assert_eq!(answer.into_text().unwrap().as_str(), text);
    }
    ws.close(None).await.unwrap();
}

/// The E2B SDK's `get_host(port)` names the gateway's host for the port, and its
/// `traffic_access_token` opens it (`tests/sdk/e2b_ports.py`).
#[tokio::test]
async fn the_e2b_sdk_get_host_reaches_the_port() {
    if !root_or_skip("local_ports::e2b_get_host") {
        return;
    }
    let python = crate::common::sdk::python();
    if let Some(reason) = crate::common::sdk::missing(&python, "e2b") {
        assert!(!in_ci(), "the E2B SDK is missing under CI: {reason}");
        eprintln!("SKIPPED local_ports::e2b_get_host: {reason}");
        return;
    }
    init();
    let key = "e2b_0123456789abcdef0123456789abcdef0123ab01";
    let dir = tempfile::tempdir().unwrap();
    let extra_toml = format!(
        r#"
[e2b]
listen = "127.0.0.1:0"
[[e2b.api_keys]]
key = "{key}"
principal = "alice"
workspace = "ws-a"

[local]
dir = "{dir}/sandboxes"
snapshot_dir = "{dir}/snapshots"
netns_prefix = "sgp-"
cgroup = "sandgate-ptest"
"#,
        dir = dir.path().display(),
    );
    let gw = Gateway::start(GatewayOptions {
        identities: vec![],
        extra_toml,
        ..GatewayOptions::default()
    })
    .await;
    let ca = gw.dir.path().join("ports-ca.pem");
    std::fs::write(&ca, &gw.sandgate_ca_pem).unwrap();
    let facade = format!("http://{}", gw.server.e2b_addr().unwrap());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/e2b_ports.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(script)
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", &facade)
        .env("E2B_SANDBOX_URL", &facade)
        .env("PORTS_CA", &ca)
        .env(
            "PORTS_LISTENER",
            gw.server.ports_addr().unwrap().to_string(),
        )
        .env("NO_PROXY", "*")
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .kill_on_drop(true);
    for proxy in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env_remove(proxy);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the SDK script finishes within 120 s")
        .expect("the SDK script starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(
        stdout
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("PORTS OK "))
            .unwrap_or_else(|| panic!("no PORTS OK line:\n{stdout}")),
    )
    .unwrap();
    let listener = gw.server.ports_addr().unwrap().port();
    let host = result["host"].as_str().unwrap();
    assert!(
        host.starts_with("8000-sb-") && host.ends_with(&format!(".sandgate.localhost:{listener}")),
        "{result}"
    );
    assert_eq!(result["anonymous"], 401, "{result}");
    drop(gw);
    drop(dir);
}

/// With `[ports] enabled = false` the local pool says so (`public_ports: false`), a create
/// that needs public ports finds no pool, and a port's URL is 501 `unsupported`.
#[tokio::test]
async fn without_the_ports_gateway_the_pool_declares_no_public_ports() {
    if !root_or_skip("local_ports::ports_off") {
        return;
    }
    init();
    let dir = tempfile::tempdir().unwrap();
    let extra_toml = format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"

[ports]
enabled = false

[local]
dir = "{dir}/sandboxes"
snapshot_dir = "{dir}/snapshots"
netns_prefix = "sgo-"
cgroup = "sandgate-otest"
"#,
        dir = dir.path().display(),
    );
    let gw = Gateway::start(GatewayOptions {
        identities: vec![],
        extra_toml,
        ..GatewayOptions::default()
    })
    .await;
    assert_eq!(gw.server.ports_addr(), None);
    let pools = gw.api_json("/v1/pools", TOKEN_A).await;
    assert_eq!(public_ports_declared(&pools), Some(false), "{pools:#}");
    let http = reqwest::Client::new();
    let create = |body: Value| {
        http.post(gw.api("/v1/sandboxes"))
            .bearer_auth(TOKEN_A)
            .json(&body)
            .send()
    };
    let refused = create(json!({"features": {"public_ports": true}}))
        .await
        .unwrap();
    assert_eq!(refused.status(), 422, "{}", refused.text().await.unwrap());
    let created: Value = create(json!({})).await.unwrap().json().await.unwrap();
    let id = created["id"].as_str().unwrap();
    let answer = http
        .get(gw.api(&format!("/v1/sandboxes/{id}/ports/8000")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 501);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unsupported", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("ports"),
        "{body}"
    );
    drop(gw);
    drop(dir);
}
