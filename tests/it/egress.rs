//! Egress proxy over real sockets: real TLS on both sides, reqwest and curl as sandbox
//! clients, real origins, the bundled Rego policy.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn setup() -> (TestCa, Origin, Gateway) {
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&[
        "api.a.test",
        "api.b.test",
        "x.wild.test",
        "meta.test",
    ])))
    .await;
    let gateway = Gateway::start(GatewayOptions {
        upstream_ca: Some(ca.pem_path.clone()),
        ..Default::default()
    })
    .await;
    (ca, origin, gateway)
}

#[tokio::test]
async fn allowed_host_reaches_origin_over_h1_and_h2() {
    let (_ca, origin, gw) = setup().await;
    for (http1_only, expected) in [
        (true, reqwest::Version::HTTP_11),
        (false, reqwest::Version::HTTP_2),
    ] {
        let client = gw.client("sb-a", http1_only);
        let url = format!("https://api.a.test:{}/hello?q=1", origin.port());
        let response = client
            .get(&url)
            .header("x-from-sandbox", "yes")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.version(), expected, "client-side protocol");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["path"], "/hello?q=1");
        assert_eq!(body["headers"]["x-from-sandbox"], "yes");
        assert!(body["headers"].get("proxy-authorization").is_none());
    }
    assert_eq!(origin.count(), 2);
    // A wildcard pattern admits a subdomain.
    let response = gw
        .client("sb-a", false)
        .get(format!("https://x.wild.test:{}/", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let records = gw.decisions(3).await;
    let request = records
        .iter()
        .find(|r| r["phase"] == "request" && r["decision"] == "allow")
        .expect("an allowed request record");
    assert_eq!(request["sandbox"], "sb-a");
    assert_eq!(request["workspace"], "ws-a");
    assert_eq!(request["host"], "api.a.test");
    assert_eq!(request["path"], "/hello?q=", "query values are not logged");
    assert!(request["policy_generation"].as_u64().unwrap() >= 1);
    gw.server.shutdown();
}

#[tokio::test]
async fn curl_through_the_proxy_over_h1_and_h2() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("curl not installed; skipping");
        return;
    }
    let (_ca, origin, gw) = setup().await;
    let ca_file = gw.dir.path().join("sandgate-ca.pem");
    std::fs::write(&ca_file, &gw.sandgate_ca_pem).unwrap();
    for flag in ["--http1.1", "--http2"] {
        let out = tokio::process::Command::new("curl")
            .args(["-sS", flag, "--max-time", "10", "-w", "\n%{http_version}"])
            .arg("--proxy")
            .arg(gw.proxy_url("sb-a", TOKEN))
            .arg("--cacert")
            .arg(&ca_file)
            .arg(format!("https://api.a.test:{}/curl", origin.port()))
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "curl {flag}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (body, version) = stdout.rsplit_once('\n').unwrap();
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["path"], "/curl");
        assert_eq!(version, if flag == "--http2" { "2" } else { "1.1" });
    }
    // A denied destination shows the JSON reason to curl users too.
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--proxy"])
        .arg(gw.proxy_url("sb-a", TOKEN))
        .arg("--cacert")
        .arg(&ca_file)
        .arg(format!("https://api.b.test:{}/", origin.port()))
        .output()
        .await
        .unwrap();
    // (deny_mode = "connect" here: curl reports only the CONNECT's status; the in-tunnel
    // default, which shows the body, is tests/it/deny_in_tunnel.rs.)
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("403"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    gw.server.shutdown();
}

#[tokio::test]
async fn denied_host_gets_403_json_and_origin_is_not_reached() {
    let (_ca, origin, gw) = setup().await;
    let err = connect_tunnel(
        gw.server.proxy_addr(),
        &format!("api.b.test:{}", origin.port()),
        Some(("sb-a", TOKEN)),
    )
    .await
    .unwrap_err();
    assert_eq!(err.0, 403);
    assert!(
        err.1
            .to_ascii_lowercase()
            .contains("x-sandgate-error: egress_denied"),
        "{}",
        err.1
    );
    let body: serde_json::Value =
        serde_json::from_str(err.1.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "egress_denied");
    assert_eq!(body["error"]["details"]["host"], "api.b.test");
    assert_eq!(body["error"]["details"]["port"], origin.port());
    assert!(!body["error"]["details"]["reasons"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(origin.count(), 0);
    assert_eq!(
        origin.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );

    // reqwest sees the refusal of the CONNECT as an error.
    let result = gw
        .client("sb-a", false)
        .get(format!("https://api.b.test:{}/", origin.port()))
        .send()
        .await;
    assert!(result.is_err());
    assert_eq!(origin.count(), 0);
    let records = gw.decisions(2).await;
    assert!(records.iter().any(|r| r["decision"] == "deny"
        && r["code"] == "egress_denied"
        && r["host"] == "api.b.test"));
    gw.server.shutdown();
}

#[tokio::test]
async fn missing_or_wrong_credentials_get_407() {
    let (_ca, origin, gw) = setup().await;
    let target = format!("api.a.test:{}", origin.port());
    for auth in [
        None,
        Some(("sb-a", "wrong-token-123")),
        Some(("nobody", TOKEN)),
    ] {
        let err = connect_tunnel(gw.server.proxy_addr(), &target, auth)
            .await
            .unwrap_err();
        assert_eq!(err.0, 407);
        assert!(err.1.contains("Basic realm=\"sandgate\""), "{}", err.1);
        assert!(err.1.contains("proxy_auth_required"));
    }
    // Plain absolute-form without credentials too.
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{}", gw.server.proxy_addr())).unwrap())
        .build()
        .unwrap();
    let response = client.get("http://plain.test:1/").send().await.unwrap();
    assert_eq!(response.status(), 407);
    assert_eq!(origin.count(), 0);
    gw.server.shutdown();
}

#[tokio::test]
async fn metadata_address_is_refused_even_when_policy_allows_the_name() {
    let (_ca, origin, gw) = setup().await;
    // meta.test is in sb-a's allow_domains but resolves to 169.254.169.254.
    let err = connect_tunnel(
        gw.server.proxy_addr(),
        "meta.test:443",
        Some(("sb-a", TOKEN)),
    )
    .await
    .unwrap_err();
    assert_eq!(err.0, 403);
    assert!(err.1.contains("destination_forbidden"), "{}", err.1);
    assert!(err.1.contains("169.254.169.254"));
    // An IP literal in a private range is refused the same way.
    let gw2 = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec::new(
            "sb-ip",
            "ws",
            vec!["10.1.2.3", "::ffff:169.254.169.254"],
        )],
        ..Default::default()
    })
    .await;
    for target in ["10.1.2.3:443", "[::ffff:169.254.169.254]:80"] {
        let err = connect_tunnel(gw2.server.proxy_addr(), target, Some(("sb-ip", TOKEN)))
            .await
            .unwrap_err();
        assert_eq!(err.0, 403, "{target}");
        assert!(err.1.contains("destination_forbidden"), "{}", err.1);
    }
    assert_eq!(origin.count(), 0);
    gw.server.shutdown();
    gw2.server.shutdown();
}

#[tokio::test]
async fn host_header_not_matching_the_tunnel_is_misdirected() {
    let (_ca, origin, gw) = setup().await;
    let tls = gw
        .tls_tunnel(
            "sb-a",
            "api.a.test",
            origin.port(),
            "api.a.test",
            &[b"http/1.1"],
        )
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::builder()
        .uri("/")
        .header("host", format!("api.b.test:{}", origin.port()))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 421);
    assert_eq!(
        response.headers()["x-sandgate-error"],
        "misdirected_request"
    );
    // The same tunnel still serves a request naming the right host.
    let request = http::Request::builder()
        .uri("/ok")
        .header("host", format!("api.a.test:{}", origin.port()))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(origin.count(), 1);
    assert_eq!(origin.last().unwrap().path, "/ok");

    // h2: :authority must match too.
    let tls = gw
        .tls_tunnel("sb-a", "api.a.test", origin.port(), "api.a.test", &[b"h2"])
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = http::Request::builder()
        .uri(format!("https://api.b.test:{}/", origin.port()))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 421);
    assert_eq!(origin.count(), 1);
    gw.server.shutdown();
}

#[tokio::test]
async fn sni_not_matching_the_connect_host_is_refused() {
    let (_ca, origin, gw) = setup().await;
    let stream = connect_tunnel(
        gw.server.proxy_addr(),
        &format!("api.a.test:{}", origin.port()),
        Some(("sb-a", TOKEN)),
    )
    .await
    .unwrap();
    let result = tls_over(stream, &gw.sandgate_ca_pem, "api.b.test", &[b"http/1.1"]).await;
    assert!(result.is_err(), "handshake with a foreign SNI must fail");
    let records = gw.decisions(2).await;
    assert!(records
        .iter()
        .any(|r| r["phase"] == "tls" && r["code"] == "misdirected_request"));
    assert_eq!(origin.count(), 0);
    gw.server.shutdown();
}

#[tokio::test]
async fn trace_is_refused() {
    let (_ca, origin, gw) = setup().await;
    let response = gw
        .client("sb-a", true)
        .request(
            reqwest::Method::TRACE,
            format!("https://api.a.test:{}/", origin.port()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["x-sandgate-error"], "method_not_allowed");
    assert_eq!(origin.count(), 0);
    gw.server.shutdown();
}

#[tokio::test]
async fn websocket_echo_through_the_proxy() {
    let (_ca, origin, gw) = setup().await;
    let tls = gw
        .tls_tunnel(
            "sb-a",
            "api.a.test",
            origin.port(),
            "api.a.test",
            &[b"http/1.1"],
        )
        .await
        .unwrap();
    let (mut ws, response) =
        tokio_tungstenite::client_async(format!("wss://api.a.test:{}/ws", origin.port()), tls)
            .await
            .unwrap();
    assert_eq!(response.status(), 101);
    for text in ["hello", "through", "sandgate"] {
        ws.send(tokio_tungstenite::tungstenite::Message::text(text))
            .await
            .unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), text);
    }
    assert_eq!(origin.last().unwrap().path, "/ws");
    gw.server.shutdown();
}

/// RFC 8441: a WebSocket over an h2 stream (extended CONNECT with `:protocol = websocket`)
/// reaches an origin that speaks WebSocket over HTTP/1.1; sandgate translates, and the
/// policy decides first (a denied path never reaches the origin).
#[tokio::test]
async fn websocket_over_h2_extended_connect_reaches_an_h1_origin() {
    let (_ca, origin, gw) = setup().await;
    std::fs::write(
        gw.policy_dir.join("ws_paths.rego"),
        "package sandgate.egress\nimport rego.v1\ndeny contains \"no sockets on /forbidden\" if input.request.path == \"/forbidden\"\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let tls = gw
        .tls_tunnel("sb-a", "api.a.test", origin.port(), "api.a.test", &[b"h2"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let extended_connect = |path: &str| {
        let mut request = http::Request::builder()
            .method("CONNECT")
            .uri(format!("https://api.a.test:{}{path}", origin.port()))
            .header("sec-websocket-version", "13")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        request
            .extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        request
    };
    // Let the server's SETTINGS (which enable extended CONNECT) arrive.
    sender.ready().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let before = origin.count();
    let refused = sender
        .send_request(extended_connect("/forbidden"))
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert_eq!(
        origin.count(),
        before,
        "a refused socket reached the origin"
    );

    let mut response = sender.send_request(extended_connect("/ws")).await.unwrap();
    assert_eq!(response.status(), 200);
    let upgraded = hyper::upgrade::on(&mut response).await.unwrap();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    for text in ["over", "h2", "streams"] {
        ws.send(tokio_tungstenite::tungstenite::Message::text(text))
            .await
            .unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), text);
    }
    let seen = origin.last().unwrap();
    assert_eq!(seen.path, "/ws");
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.version, "HTTP/1.1");
    gw.server.shutdown();
}

#[tokio::test]
async fn grpc_style_h2_request_keeps_trailers_both_ways() {
    let (_ca, origin, gw) = setup().await;
    let tls = gw
        .tls_tunnel("sb-a", "api.a.test", origin.port(), "api.a.test", &[b"h2"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut request_trailers = http::HeaderMap::new();
    request_trailers.insert("x-request-trailer", "from-sandbox".parse().unwrap());
    let frames = vec![
        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(
            b"\x00\x00\x00\x00\x05hello",
        ))),
        Ok(Frame::trailers(request_trailers)),
    ];
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("https://api.a.test:{}/grpc", origin.port()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("response trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["x-echo-request-trailer"], "from-sandbox");
    assert_eq!(&collected.to_bytes()[..], b"\x00\x00\x00\x00\x05hello");
    let seen = origin.last().unwrap();
    assert_eq!(
        seen.version, "HTTP/2.0",
        "upstream hop negotiated h2 on its own"
    );
    assert_eq!(seen.headers.get("te").map(String::as_str), Some("trailers"));
    gw.server.shutdown();
}

#[tokio::test]
async fn plain_http_absolute_form_is_checked_and_forwarded() {
    init();
    let origin = start_origin(None).await;
    let gw = Gateway::start(GatewayOptions::default()).await;
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(gw.proxy_url("sb-a", TOKEN)).unwrap())
        .build()
        .unwrap();
    let response = client
        .get(format!("http://plain.test:{}/abs?x=1", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["path"], "/abs?x=1");
    assert!(body["headers"].get("proxy-authorization").is_none());
    // Denied name: refused before any lookup or connection.
    let response = client
        .get(format!("http://api.b.test:{}/", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(response.headers()["x-sandgate-error"], "egress_denied");
    assert_eq!(origin.count(), 1);

    // A Host header naming another site than the URI is refused.
    let mut stream = tokio::net::TcpStream::connect(gw.server.proxy_addr())
        .await
        .unwrap();
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("sb-a:{TOKEN}"));
    let head = format!(
        "GET http://plain.test:{}/x HTTP/1.1\r\nHost: api.b.test\r\nProxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n",
        origin.port()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    assert_eq!(origin.count(), 1);
    gw.server.shutdown();
}

#[tokio::test]
async fn plain_http_inside_a_connect_tunnel_is_inspected() {
    init();
    let origin = start_origin(None).await;
    let gw = Gateway::start(GatewayOptions::default()).await;
    let stream = connect_tunnel(
        gw.server.proxy_addr(),
        &format!("plain.test:{}", origin.port()),
        Some(("sb-a", TOKEN)),
    )
    .await
    .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::builder()
        .uri("/in-tunnel")
        .header("host", format!("plain.test:{}", origin.port()))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(origin.last().unwrap().path, "/in-tunnel");
    gw.server.shutdown();
}

const TUNNEL_POLICY: &str = r#"package sandgate.egress
import rego.v1

# Opaque tunnels only for the echo service.
action := "tunnel" if input.destination.host == "echo.test"
"#;

#[tokio::test]
async fn opaque_tunnel_only_when_policy_says_tunnel() {
    init();
    let (echo, accepted) = start_tcp_echo().await;
    let gw = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec::new(
            "sb-t",
            "ws",
            vec!["echo.test", "raw.test"],
        )],
        hosts: vec![("echo.test", "127.0.0.1"), ("raw.test", "127.0.0.1")],
        extra_policies: vec![("tunnel.rego", TUNNEL_POLICY.to_string())],
        ..Default::default()
    })
    .await;
    let mut stream = connect_tunnel(
        gw.server.proxy_addr(),
        &format!("echo.test:{}", echo.port()),
        Some(("sb-t", TOKEN)),
    )
    .await
    .unwrap();
    stream
        .write_all(b"\x00\x01binary protocol\n")
        .await
        .unwrap();
    let mut buf = [0u8; 18];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"\x00\x01binary protocol\n");

    // Allowed destination, but the action is inspect: non-HTTP bytes are refused.
    let mut stream = connect_tunnel(
        gw.server.proxy_addr(),
        &format!("raw.test:{}", echo.port()),
        Some(("sb-t", TOKEN)),
    )
    .await
    .unwrap();
    stream
        .write_all(b"\x00\x01binary protocol\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(
        n, 0,
        "nothing may come back from an inspected non-HTTP tunnel"
    );
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the tunnel reached the echo server"
    );
    let records = gw.decisions(3).await;
    assert!(records
        .iter()
        .any(|r| r["code"] == "tunnel_refused" && r["host"] == "raw.test"));
    assert!(records
        .iter()
        .any(|r| r["action"] == "tunnel" && r["host"] == "echo.test"));
    gw.server.shutdown();
}

#[tokio::test]
async fn policy_hot_reload_applies_new_rules_and_keeps_the_last_good_one() {
    let (_ca, origin, gw) = setup().await;
    let client = gw.client("sb-a", false);
    let url = format!("https://api.b.test:{}/", origin.port());
    assert!(
        client.get(&url).send().await.is_err(),
        "api.b.test starts denied"
    );
    let health: serde_json::Value = reqwest::get(gw.api("/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first_generation = health["policy"]["generation"].as_u64().unwrap();

    std::fs::write(
        gw.policy_dir.join("extra.rego"),
        "package sandgate.egress\nimport rego.v1\nallow if input.destination.host == \"api.b.test\"\n",
    )
    .unwrap();
    let mut allowed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let client = gw.client("sb-a", false);
        if let Ok(response) = client.get(&url).send().await {
            assert_eq!(response.status(), 200);
            allowed = true;
            break;
        }
    }
    assert!(allowed, "the new rule took effect");
    let health: serde_json::Value = reqwest::get(gw.api("/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let second_generation = health["policy"]["generation"].as_u64().unwrap();
    assert!(second_generation > first_generation);
    assert_eq!(health["status"], "ok");

    // A broken file never replaces the serving policy.
    std::fs::write(
        gw.policy_dir.join("broken.rego"),
        "package sandgate.egress\nallow if {{{ nope\n",
    )
    .unwrap();
    let mut degraded = serde_json::Value::Null;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let health: serde_json::Value = reqwest::get(gw.api("/healthz"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if health["status"] == "degraded" {
            degraded = health;
            break;
        }
    }
    assert_eq!(
        degraded["status"], "degraded",
        "healthz reports the broken policy"
    );
    assert!(degraded["policy"]["last_error"]
        .as_str()
        .unwrap()
        .contains("broken.rego"));
    assert_eq!(
        degraded["policy"]["generation"].as_u64().unwrap(),
        second_generation
    );
    let response = gw.client("sb-a", false).get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200, "the last good policy still serves");
    let response = gw
        .client("sb-a", false)
        .get(format!("https://api.a.test:{}/", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    gw.server.shutdown();
}

#[tokio::test]
async fn leaf_certificates_are_minted_per_host_signed_by_the_ca_and_cached() {
    let (_ca, origin, gw) = setup().await;
    let mut leaves = Vec::new();
    for _ in 0..2 {
        let tls = gw
            .tls_tunnel(
                "sb-a",
                "api.a.test",
                origin.port(),
                "api.a.test",
                &[b"http/1.1"],
            )
            .await
            .unwrap();
        let chain: Vec<Vec<u8>> = tls
            .get_ref()
            .1
            .peer_certificates()
            .unwrap()
            .iter()
            .map(|c| c.to_vec())
            .collect();
        leaves.push(chain);
    }
    assert_eq!(leaves[0].len(), 2, "leaf plus CA");
    assert_eq!(
        leaves[0], leaves[1],
        "the second connection reuses the cached leaf"
    );
    let ca_der = rustls_pemfile::certs(&mut &gw.sandgate_ca_pem[..])
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(leaves[0][1], ca_der.to_vec());
    assert_ne!(leaves[0][0], ca_der.to_vec(), "the CA is never the leaf");
    let other = {
        let tls = gw
            .tls_tunnel(
                "sb-a",
                "x.wild.test",
                origin.port(),
                "x.wild.test",
                &[b"http/1.1"],
            )
            .await
            .unwrap();
        tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    };
    assert_ne!(other, leaves[0][0], "each host gets its own leaf");
    gw.server.shutdown();
}

#[tokio::test]
async fn connections_beyond_the_limit_are_shed_with_503() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nmax_connections = 1\n[api]\nlisten = \"127.0.0.1:0\"\n[tls]\nca_dir = {:?}\n[store]\npath = {:?}\n[secrets]\nmaster_key_file = {:?}\n[policy]\ndir = {:?}\n[log]\ndecisions = \"off\"\n",
        dir.path().join("certs").display().to_string(),
        dir.path().join("db").display().to_string(),
        dir.path().join("key").display().to_string(),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies").display().to_string(),
    );
    let server =
        sandgate::server::Server::start(sandgate::config::Config::from_toml(&toml).unwrap())
            .await
            .unwrap();
    let _held = tokio::net::TcpStream::connect(server.proxy_addr())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = tokio::net::TcpStream::connect(server.proxy_addr())
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), second.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("x-sandgate-error: overloaded"));
    server.shutdown();
}

#[tokio::test]
async fn a_sandbox_listener_attributes_traffic_to_its_sandbox_whatever_header_it_forges() {
    let (_ca, origin, gw) = setup().await;
    // sb-2's own listener (the local provider binds one inside each sandbox's namespace).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(sandgate::egress::serve_for(
        listener,
        gw.server.egress.clone(),
        std::sync::Arc::from("sb-2"),
    ));
    // Before its identity is registered, the listener lets nothing out.
    let err = connect_tunnel(addr, &format!("api.b.test:{}", origin.port()), None)
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{}", err.1);
    assert!(err.1.contains("sandbox_inactive"), "{}", err.1);
    gw.server
        .egress
        .identities
        .register(sandgate::identity::Identity::new(
            "sb-2",
            "unused-token-xyz",
            "ws-2",
            vec!["api.b.test".into()],
            Default::default(),
        ));
    // Forging sb-a's valid credentials does not make it sb-a: api.a.test is not sb-2's.
    let err = connect_tunnel(
        addr,
        &format!("api.a.test:{}", origin.port()),
        Some(("sb-a", TOKEN)),
    )
    .await
    .unwrap_err();
    assert_eq!(err.0, 403, "{}", err.1);
    // Its own destination works without any header at all.
    let mut stream = connect_tunnel(addr, &format!("api.b.test:{}", origin.port()), None)
        .await
        .unwrap();
    stream.write_all(b"").await.unwrap();
    let tls = tls_over(stream, &gw.sandgate_ca_pem, "api.b.test", &[b"http/1.1"])
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::builder()
        .uri("/mine")
        .header("host", format!("api.b.test:{}", origin.port()))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    assert_eq!(sender.send_request(request).await.unwrap().status(), 200);
    let records = gw.decisions(2).await;
    assert!(records
        .iter()
        .any(|r| r["sandbox"] == "sb-2" && r["host"] == "api.a.test" && r["decision"] == "deny"));
    assert!(records
        .iter()
        .all(|r| !(r["sandbox"] == "sb-a" && r["host"] == "api.a.test")));
    // Revoking the identity (as deleting the sandbox does) cuts the listener off at once.
    gw.server.egress.identities.revoke("sb-2");
    let err = connect_tunnel(addr, &format!("api.b.test:{}", origin.port()), None)
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{}", err.1);
    task.abort();
    gw.server.shutdown();
}

#[tokio::test]
async fn an_oversized_request_head_is_refused_before_any_policy_or_upstream_work() {
    init();
    let origin = start_origin(None).await;
    let gw = Gateway::start(GatewayOptions::default()).await;
    let mut stream = tokio::net::TcpStream::connect(gw.server.proxy_addr())
        .await
        .unwrap();
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("sb-a:{TOKEN}"));
    let big = "x".repeat(200 * 1024);
    let head = format!(
        "GET http://plain.test:{}/ HTTP/1.1\r\nHost: plain.test:{}\r\nProxy-Authorization: Basic {auth}\r\nX-Big: {big}\r\n\r\n",
        origin.port(),
        origin.port()
    );
    // The proxy may stop reading midway; a failed write is part of the refusal.
    let _ = stream.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert_eq!(origin.count(), 0);
    gw.server.shutdown();
}

#[tokio::test]
async fn unreachable_or_unresolvable_upstreams_are_reported_with_their_codes() {
    init();
    let gw = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec::new(
            "sb-a",
            "ws-a",
            vec!["plain.test", "nowhere.invalid"],
        )],
        ..Default::default()
    })
    .await;
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(gw.proxy_url("sb-a", TOKEN)).unwrap())
        .build()
        .unwrap();
    // Nothing listens on port 9 of the (exempt) loopback address.
    let response = client.get("http://plain.test:9/").send().await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(response.headers()["x-sandgate-error"], "upstream_failed");
    // `.invalid` never resolves (RFC 6761).
    let response = client.get("http://nowhere.invalid/").send().await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(response.headers()["x-sandgate-error"], "dns_failed");
    gw.server.shutdown();
}

/// Files written in place by an editor or a deploy tool pass through partial states that
/// can parse. Here the partial state (the file without its last line) denies everything
/// with a reason no complete version gives: it must never be served, however often the
/// file is rewritten under load.
#[tokio::test]
async fn a_policy_file_rewritten_in_place_under_load_is_never_served_half_written() {
    let (_ca, origin, gw) = setup().await;
    let generation = |gw: &Gateway| {
        let url = gw.api("/healthz");
        async move {
            let health: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
            health["policy"]["generation"].as_u64().unwrap()
        }
    };
    let prefix = |n: usize| {
        format!(
            "package sandgate.egress\nimport rego.v1\n\n# revision {n}\ndefault complete := false\ndeny contains \"partial file served\" if not complete\n{}\n",
            "# padding so the write takes more than one syscall\n".repeat(200)
        )
    };
    let path = gw.policy_dir.join("inplace.rego");
    std::fs::write(&path, format!("{}complete := true\n", prefix(0))).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let first = generation(&gw).await;

    let writer_path = path.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_writer = stop.clone();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut n = 1;
        while !stop_writer.load(std::sync::atomic::Ordering::Relaxed) {
            let mut file = std::fs::File::create(&writer_path).unwrap();
            file.write_all(prefix(n).as_bytes()).unwrap();
            file.flush().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            file.write_all(b"complete := true\n").unwrap();
            drop(file);
            // Each complete version stays long enough to be loaded on a busy machine (a
            // load needs the files unchanged over two polls and the build).
            std::thread::sleep(Duration::from_millis(600));
            n += 1;
        }
    });
    let client = gw.client("sb-a", false);
    let url = format!("https://api.a.test:{}/", origin.port());
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    let mut served = 0;
    while std::time::Instant::now() < deadline {
        let response = client.get(&url).send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert_eq!(status, 200, "a half-written policy was served: {body}");
        served += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let last = generation(&gw).await;
    assert!(served > 20, "{served}");
    assert!(
        last >= first + 2,
        "the rewrites were not loaded: {first} -> {last}"
    );
    gw.server.shutdown();
}
