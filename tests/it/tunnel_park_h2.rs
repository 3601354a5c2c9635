//! An intercepted h2 tunnel parks when idle (`egress::park_h2`: hyper's h2 connection
//! dropped, the TLS session kept, the connection built again from a replay when the client
//! sends its next byte), and clients cannot tell: the same connection carries requests with
//! the same headers, uploads and downloads far past the connection's flow-control windows,
//! concurrent streams and trailers after any number of parks, with hyper's h2 client and
//! with curl's nghttp2 (which checks every frame it gets). The idle timeout ends a parked h2
//! tunnel with GOAWAY, and revoking its identity ends it at once. Each test first sees the
//! tunnel parked in the gateway's metrics, so none passes without a park having happened.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::common::*;
use crate::tunnel_park::{setup, wait_parks, Setup};

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

/// An h2 connection through a tunnel; the handle resolves when the connection ends.
async fn h2(s: &Setup) -> (Sender, tokio::task::JoinHandle<hyper::Result<()>>) {
    let tls =
        s.gw.tls_tunnel(
            "sb-a",
            "api.a.test",
            s.origin.port(),
            "api.a.test",
            &[b"h2"],
        )
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    (sender, tokio::spawn(conn))
}

fn url(s: &Setup, path: &str) -> String {
    format!("https://api.a.test:{}{path}", s.origin.port())
}

/// A GET with the same long header each time (what a client's HPACK table would index).
async fn get(s: &Setup, sender: &mut Sender, path: &str) -> serde_json::Value {
    let request = http::Request::get(url(s, path))
        .header(
            "x-same-every-time",
            "a-value-long-enough-to-be-worth-indexing-0123456789",
        )
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        seen["headers"]["x-same-every-time"],
        "a-value-long-enough-to-be-worth-indexing-0123456789"
    );
    seen
}

/// POSTs `len` bytes to the origin's echo and checks every byte comes back.
async fn echo(s: &Setup, sender: &mut Sender, len: usize, seed: u8) {
    let payload: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    let request = http::Request::post(url(s, "/grpc"))
        .body(Full::new(Bytes::from(payload.clone())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), len);
    assert!(body[..] == payload[..], "the echoed body differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_h2_tunnel_carries_on_as_one_connection() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 60\n").await;
    let (mut sender, conn) = h2(&s).await;
    get(&s, &mut sender, "/first").await;
    for round in 1..=4u8 {
        wait_parks(&s.gw, f64::from(round)).await;
        assert_eq!(s.gw.metric("sandgate_proxy_tunnels_parked").await, 1.0);
        // 3 MiB each way is three times the connection's receive window and far past the
        // client's: a window the park got wrong stalls or breaks this.
        echo(&s, &mut sender, 3 << 20, round).await;
        get(&s, &mut sender, &format!("/round-{round}")).await;
        let mut streams = Vec::new();
        for i in 0..8 {
            let mut sender = sender.clone();
            let path = format!("/concurrent-{round}-{i}");
            let s = &s;
            streams.push(async move { get(s, &mut sender, &path).await });
        }
        futures_util::future::join_all(streams).await;
    }
    assert!(!conn.is_finished(), "the client's connection ended");
    assert_eq!(
        s.gw.metric("sandgate_proxy_tunnels_active").await,
        1.0,
        "one tunnel served every round"
    );
    assert_eq!(s.origin.count(), 1 + 4 * 10);
    s.gw.server.shutdown();
}

/// curl (nghttp2) across parks: three uploads echoed, 2 s apart, on one connection. nghttp2
/// ends the connection on any frame it did not expect (an unasked SETTINGS ACK, data past
/// its window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_keeps_one_h2_connection_across_parks() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 60\n").await;
    let ca_file = s.gw.dir.path().join("sandgate-ca.pem");
    std::fs::write(&ca_file, &s.gw.sandgate_ca_pem).unwrap();
    let upload = s.gw.dir.path().join("upload.bin");
    let payload: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&upload, &payload).unwrap();
    let target = url(&s, "/grpc");
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--http2", "--max-time", "60", "--rate", "30/m"])
        .args(["-w", "%{http_version} %{size_download} %{num_connects}\\n"])
        .args(["-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null"])
        .arg("--proxy")
        .arg(s.gw.proxy_url("sb-a", TOKEN))
        .arg("--cacert")
        .arg(&ca_file)
        .arg("--data-binary")
        .arg(format!("@{}", upload.display()))
        .args([&target, &target, &target])
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .await
        .expect("curl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "curl: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    eprintln!("curl: {stdout}");
    let size = payload.len();
    assert_eq!(
        lines,
        [
            format!("2 {size} 1"),
            format!("2 {size} 0"),
            format!("2 {size} 0")
        ],
        "every transfer h2, echoed whole, on the first connection"
    );
    assert!(
        s.gw.metric("sandgate_proxy_tunnel_parks_total").await >= 2.0,
        "curl's pauses were long enough to park twice"
    );
    s.gw.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_h2_tunnel_says_goaway_at_its_idle_timeout() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 3\n").await;
    let (mut sender, conn) = h2(&s).await;
    get(&s, &mut sender, "/x").await;
    let idle_from = Instant::now();
    wait_parks(&s.gw, 1.0).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("a parked h2 tunnel outlived its idle timeout")
        .unwrap();
    // hyper's client ends its connection without an error on a GOAWAY with NO_ERROR; a
    // connection cut without one is an error.
    ended.expect("the connection ended with a GOAWAY, not a cut");
    assert!(
        idle_from.elapsed() >= Duration::from_millis(2500),
        "closed after {:?}, before the idle timeout",
        idle_from.elapsed()
    );
    s.gw.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_an_identity_ends_its_parked_h2_tunnels_at_once() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 60\n").await;
    let mut conns = Vec::new();
    for _ in 0..3 {
        let (mut sender, conn) = h2(&s).await;
        get(&s, &mut sender, "/x").await;
        conns.push((sender, conn));
    }
    wait_parks(&s.gw, 3.0).await;
    s.gw.server.egress.identities.revoke("sb-a");
    for (_sender, conn) in conns {
        assert!(
            tokio::time::timeout(Duration::from_secs(1), conn)
                .await
                .is_ok(),
            "a parked h2 tunnel was still open a second after its identity was revoked"
        );
    }
    assert_eq!(s.gw.metric("sandgate_proxy_tunnels_parked").await, 0.0);
    s.gw.server.shutdown();
}
