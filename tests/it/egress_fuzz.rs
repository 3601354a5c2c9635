//! Hostile bytes through the real request path: generated CONNECT authorities, request
//! paths, header names and values (any byte but CR/LF, so multi-byte UTF-8 and invalid
//! UTF-8 alike), written raw on the wire over real TCP and TLS, over HTTP/1.1 and h2, to a
//! sandbox that has credentials bound (so every credential parser runs).
//!
//! The property: every request gets an HTTP answer (whatever its status), nothing panics
//! (`sandgate_proxy_panics_total` stays 0), and once the clients are gone the connection and
//! tunnel gauges are back to zero. Every integration test shares this process, so the
//! gateway gets a recorder of its own (`common::own_metrics`): no other gateway moves its
//! gauges meanwhile.

use std::time::{Duration, Instant};

use crate::common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "fuzz-secret-4f1e2d3c";

/// Reads until the end of a response head (or EOF / timeout); returns what was read.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    buf
}

fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(
            any::<u8>().prop_filter("no CR/LF", |b| *b != b'\r' && *b != b'\n'),
            0..48
        ),
        Just("abcd€xyz".as_bytes().to_vec()),
        Just(b"Basic \xff\xfe".to_vec()),
        "(Basic |Bearer )?[a-zA-Z0-9+/=%_-]{0,40}".prop_map(String::into_bytes),
        "(basic |)(sgph_|%73gph%5f|SGPH_)[0-9a-f]{0,44}".prop_map(String::into_bytes),
    ]
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("authorization".to_string()),
        Just("cookie".to_string()),
        "[a-z0-9!#$%&'*+.^_`|~-]{1,20}",
        "(sgph_)[0-9a-f]{40}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/"),
        Just(".."),
        Just("."),
        Just("%2e"),
        Just("%2E%2e"),
        Just("%2f"),
        Just("%"),
        Just("%zz"),
        Just("%25"),
        Just("%00"),
        Just("sgph_"),
        Just("?"),
        Just("&"),
        Just("="),
        Just("repos"),
        Just("a"),
        Just("€"),
        Just("\\"),
        Just(";"),
        Just("%73gph_"),
        Just("0123456789abcdef0123456789abcdef01234567"),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|p| format!("/{}", p.concat()))
}

fn authority() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("api.a.test"),
        Just(":"),
        Just("443"),
        Just("["),
        Just("]"),
        Just("::1"),
        Just("%"),
        Just("@"),
        Just("sgph_"),
        Just("€"),
        Just("."),
        Just("x"),
        Just("65536"),
        Just("-"),
        Just("*"),
        Just("0123456789abcdef0123456789abcdef01234567"),
    ];
    proptest::collection::vec(piece, 1..8).prop_map(|p| p.concat())
}

#[derive(Debug, Clone)]
struct Case {
    authority: String,
    path: String,
    name: String,
    value: Vec<u8>,
}

fn case() -> impl Strategy<Value = Case> {
    (authority(), path(), header_name(), header_bytes()).prop_map(
        |(authority, path, name, value)| Case {
            authority,
            path,
            name,
            value,
        },
    )
}

/// CONNECT with an arbitrary authority: an answer, never a silent close.
async fn connect_case(gw: &Gateway, authority: &str) -> Result<(), String> {
    use base64::Engine as _;
    let mut stream = TcpStream::connect(gw.server.proxy_addr()).await.unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("sb-a:{TOKEN}"));
    let head = format!(
        "CONNECT {authority} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_head(&mut stream).await;
    if !answer.starts_with(b"HTTP/1.1 ") {
        return Err(format!(
            "CONNECT {authority:?}: no answer ({:?})",
            String::from_utf8_lossy(&answer)
        ));
    }
    Ok(())
}

/// One raw HTTP/1.1 request inside an intercepted tunnel.
async fn h1_case(gw: &Gateway, port: u16, case: &Case) -> Result<(), String> {
    let mut tls = gw
        .tls_tunnel("sb-a", "api.a.test", port, "api.a.test", &[b"http/1.1"])
        .await
        .map_err(|e| e.to_string())?;
    let mut head = format!(
        "GET {} HTTP/1.1\r\nhost: api.a.test:{port}\r\n{}: ",
        case.path, case.name
    )
    .into_bytes();
    head.extend_from_slice(&case.value);
    head.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
    tls.write_all(&head).await.map_err(|e| e.to_string())?;
    let answer = read_head(&mut tls).await;
    if !answer.starts_with(b"HTTP/1.1 ") {
        return Err(format!(
            "h1 {case:?}: no answer ({:?})",
            String::from_utf8_lossy(&answer)
        ));
    }
    // The echo origin returns the request in its body (bodies are scrubbed only when a
    // credential asks); the head must never carry the secret.
    let head_end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    if String::from_utf8_lossy(&answer[..head_end]).contains(SECRET) {
        return Err(format!(
            "h1 {case:?}: the secret came back in the response head"
        ));
    }
    Ok(())
}

/// The same over h2 (what the h2 codec lets through: hyper refuses invalid header bytes
/// on the client side, and those cases are skipped).
async fn h2_case(gw: &Gateway, port: u16, case: &Case) -> Result<(), String> {
    let Ok(value) = http::HeaderValue::from_bytes(&case.value) else {
        return Ok(());
    };
    let Ok(name) = http::HeaderName::from_bytes(case.name.as_bytes()) else {
        return Ok(());
    };
    let Ok(uri) = format!("https://api.a.test:{port}{}", case.path).parse::<http::Uri>() else {
        return Ok(());
    };
    let tls = gw
        .tls_tunnel("sb-a", "api.a.test", port, "api.a.test", &[b"h2"])
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(uri)
        .header(name, value)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    match sender.send_request(req).await {
        Ok(response) => {
            let headers = format!("{:?}", response.headers());
            if headers.contains(SECRET) {
                return Err(format!("h2 {case:?}: the secret came back"));
            }
            Ok(())
        }
        // The client's own h2 codec refuses some headers (connection-specific ones).
        Err(e) if e.is_user() => Ok(()),
        Err(e) => Err(format!("h2 {case:?}: no answer ({e})")),
    }
}

#[test]
fn hostile_bytes_always_get_an_answer_and_leave_no_trace() {
    // The proxy's gauges and panic counter have no label of their own: with its own
    // recorder, no other test's connections count.
    let metrics = own_metrics();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(move || metrics.enter())
        .build()
        .unwrap();
    let (gw, port, _ca, _dir) = runtime.block_on(async {
        init();
        let ca = TestCa::new();
        let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        let port = origin.port();
        let extra_toml = format!(
            r#"
[[credentials]]
workspace = "ws-a"
name = "gh"
secret_file = {file:?}
destinations = [{{ host = "api.a.test", ports = [{port}], path_prefix = "/repos" }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}
[[credentials]]
workspace = "ws-a"
name = "b"
secret_file = {file:?}
destinations = [{{ host = "api.a.test", ports = [{port}], path_prefix = "/b" }}]
apply = {{ type = "basic", username = "u" }}
"#,
            file = dir.path().join("secret").display().to_string()
        );
        let gw = Gateway::start(GatewayOptions {
            identities: vec![IdentitySpec {
                id: "sb-a",
                workspace: "ws-a",
                allow_domains: vec!["api.a.test"],
                credentials: vec!["gh", "b"],
            }],
            upstream_ca: Some(ca.pem_path.clone()),
            extra_toml,
            ..Default::default()
        })
        .await;
        std::mem::forget(origin);
        (gw, port, ca, dir)
    });

    // The reported case first, 21 times: a multi-byte character across byte 6.
    runtime.block_on(async {
        for _ in 0..21 {
            let case = Case {
                authority: "api.a.test:443".into(),
                path: "/repos/x".into(),
                name: "authorization".into(),
                value: "abcd€xyz".as_bytes().to_vec(),
            };
            h1_case(&gw, port, &case).await.unwrap();
        }
    });

    let cases: u32 = std::env::var("SANDGATE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |case| {
        runtime
            .block_on(async {
                connect_case(&gw, &case.authority).await?;
                h1_case(&gw, port, &case).await?;
                h2_case(&gw, port, &case).await
            })
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }

    runtime.block_on(async {
        assert_eq!(gw.metric("sandgate_proxy_panics_total").await, 0.0);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let connections = gw.metric("sandgate_proxy_connections_active").await;
            let tunnels = gw.metric("sandgate_proxy_tunnels_active").await;
            if connections == 0.0 && tunnels == 0.0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "gauges stuck at {connections} connections, {tunnels} tunnels with no client left"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        gw.server.shutdown();
    });
}
