//! An intercepted HTTP/1.1 tunnel parks when idle (`egress::park`: hyper's buffers freed, the
//! tunnel waiting for the client's next byte) and everything a client can do still works
//! across a park: the next request on the same connection, pipelined requests, the idle
//! timeout, the header-read timeout against a client that dribbles its request head, and the
//! revocation of the tunnel's identity. Each test first sees the tunnel parked in the
//! gateway's own metrics, so none passes without a park having happened.
//!
//! What a park frees goes back to the OS only when the thread that allocated it asks its
//! allocator: the last test holds each proxy worker to calling the binary's release hook on
//! its own thread.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

/// Polls until the gateway has parked `parks` bursts in all (a deadline, never a sleep the
/// outcome depends on).
pub(crate) async fn wait_parks(gw: &Gateway, parks: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = gw.metric("sandgate_proxy_tunnel_parks_total").await;
        if seen >= parks {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the tunnel never parked ({seen} parks, waited for {parks})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) struct Setup {
    pub(crate) gw: Gateway,
    pub(crate) origin: Origin,
    _ca: TestCa,
}

pub(crate) async fn setup(proxy_toml: &str) -> Setup {
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let gw = Gateway::start(GatewayOptions {
        upstream_ca: Some(ca.pem_path.clone()),
        proxy_toml: proxy_toml.to_string(),
        ..Default::default()
    })
    .await;
    Setup {
        gw,
        origin,
        _ca: ca,
    }
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn tunnel(s: &Setup) -> Tls {
    let port = s.origin.port();
    s.gw.tls_tunnel("sb-a", "api.a.test", port, "api.a.test", &[b"http/1.1"])
        .await
        .unwrap()
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: api.a.test\r\n\r\n")
}

/// Reads one response (head and a `content-length` body) and returns its status and body.
async fn response(tls: &mut Tls) -> (u16, String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut byte))
            .await
            .expect("no response within 10 s")
            .unwrap();
        assert!(n > 0, "the tunnel closed before a response head");
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let status = text[9..12].parse().unwrap();
    let length = text
        .lines()
        .find_map(|l| {
            let l = l.to_ascii_lowercase();
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    tls.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8_lossy(&body).to_string())
}

/// Whether the peer closed `tls` within `within` (EOF or a reset), reading and discarding.
async fn closed_within(tls: &mut Tls, within: Duration) -> bool {
    let mut sink = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match tls.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn a_parked_tunnel_serves_its_next_request_and_pipelined_ones() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 60\n").await;
    let mut tls = tunnel(&s).await;
    tls.write_all(get("/first").as_bytes()).await.unwrap();
    assert_eq!(response(&mut tls).await.0, 200);
    wait_parks(&s.gw, 1.0).await;
    assert_eq!(s.gw.metric("sandgate_proxy_tunnels_parked").await, 1.0);

    // The same connection, after the park: one request, then two written at once (the
    // second is past the byte that wakes the tunnel, in what hyper reads next).
    tls.write_all(get("/second").as_bytes()).await.unwrap();
    assert_eq!(response(&mut tls).await.0, 200);
    assert_eq!(s.origin.last().unwrap().path, "/second");
    wait_parks(&s.gw, 2.0).await;
    let two = format!("{}{}", get("/p1"), get("/p2"));
    tls.write_all(two.as_bytes()).await.unwrap();
    assert_eq!(response(&mut tls).await.0, 200);
    assert_eq!(response(&mut tls).await.0, 200);
    assert_eq!(s.origin.last().unwrap().path, "/p2");
    assert_eq!(s.origin.count(), 4, "every request reached the origin once");
    s.gw.server.shutdown();
}

#[tokio::test]
async fn a_parked_tunnel_is_closed_after_the_idle_timeout_not_the_header_timeout() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 3\nheader_read_timeout_secs = 1\n").await;
    let mut tls = tunnel(&s).await;
    tls.write_all(get("/x").as_bytes()).await.unwrap();
    assert_eq!(response(&mut tls).await.0, 200);
    let idle_from = Instant::now();
    wait_parks(&s.gw, 1.0).await;
    assert!(
        closed_within(&mut tls, Duration::from_secs(10)).await,
        "a parked tunnel outlived its idle timeout"
    );
    // hyper's header-read timeout (1 s) used to close an idle keep-alive tunnel; the idle
    // timeout (3 s) is the one that applies to a connection with no traffic.
    assert!(
        idle_from.elapsed() >= Duration::from_millis(2500),
        "closed after {:?}, before the idle timeout",
        idle_from.elapsed()
    );
    s.gw.server.shutdown();
}

#[tokio::test]
async fn a_request_head_dribbled_after_a_park_still_meets_the_header_read_timeout() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 60\nheader_read_timeout_secs = 1\n").await;
    let mut tls = tunnel(&s).await;
    tls.write_all(get("/x").as_bytes()).await.unwrap();
    assert_eq!(response(&mut tls).await.0, 200);
    wait_parks(&s.gw, 1.0).await;
    // One byte of a request head every 200 ms: never a complete head, never a quiet period.
    let started = Instant::now();
    let dribble =
        b"GET /slow HTTP/1.1\r\nHost: api.a.test\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut cut = false;
    for byte in dribble {
        if tls.write_all(&[*byte]).await.is_err() || tls.flush().await.is_err() {
            cut = true;
            break;
        }
        if closed_within(&mut tls, Duration::from_millis(200)).await {
            cut = true;
            break;
        }
    }
    assert!(cut, "a dribbled head was read for {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the header-read timeout (1 s) took {:?}",
        started.elapsed()
    );
    assert_eq!(
        s.origin.count(),
        1,
        "the dribbled request never reached the origin"
    );
    s.gw.server.shutdown();
}

#[tokio::test]
async fn revoking_an_identity_ends_its_parked_tunnels_at_once() {
    let _metrics = own_metrics();
    let s = setup("idle_timeout_secs = 60\n").await;
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        let mut tls = tunnel(&s).await;
        tls.write_all(get("/x").as_bytes()).await.unwrap();
        assert_eq!(response(&mut tls).await.0, 200);
        tunnels.push(tls);
    }
    wait_parks(&s.gw, 3.0).await;
    s.gw.server.egress.identities.revoke("sb-a");
    for mut tls in tunnels {
        assert!(
            closed_within(&mut tls, Duration::from_secs(1)).await,
            "a parked tunnel was still open a second after its identity was revoked"
        );
    }
    assert_eq!(s.gw.metric("sandgate_proxy_tunnels_parked").await, 0.0);
    s.gw.server.shutdown();
}

/// Names of the threads that called the release hook set below.
static RELEASED_ON: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn record_release() {
    let name = std::thread::current().name().unwrap_or("").to_string();
    RELEASED_ON.lock().unwrap().push(name);
}

#[tokio::test]
async fn every_proxy_worker_calls_the_memory_release_hook_on_its_own_thread() {
    // Process-wide, as the binary sets it. Other tests' gateways have workers of the same
    // names, so this cannot tell this gateway's workers from theirs: it fails when workers
    // never call the hook, or when anything but a worker does. What the binary's hook does
    // (a forced mimalloc collection) is measured by the `idle-tunnels` bench, not here.
    sandgate::egress::workers::set_memory_release(record_release);
    let s = setup("workers = 2\n").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let wanted = ["proxy-worker-0", "proxy-worker-1"];
    loop {
        let seen = RELEASED_ON.lock().unwrap().clone();
        if wanted.iter().all(|w| seen.iter().any(|n| n == w)) {
            assert!(
                seen.iter().all(|n| n.starts_with("proxy-worker-")),
                "the release hook ran on a thread that is not a proxy worker: {seen:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every worker called the release hook within 5 s (seen on {seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.gw.server.shutdown();
}
