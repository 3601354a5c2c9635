//! One client must not take sandgate down for the others: floods against the real
//! `sandgate serve` binary over real sockets, some under a small descriptor limit so that
//! running out of descriptors (what used to stop the proxy and `/healthz` answering) would
//! show. During each flood a normal proxied request and `/healthz` must still be answered.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN_B: &str = "tok-b-0123456789abcdef";

/// `sandgate serve` on `config`, with at most `nofile` descriptors when set.
fn serve(dir: &Path, config: &str, nofile: Option<u64>) -> Served {
    let path = dir.join("sandgate.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--config"])
        .arg(&path)
        .current_dir(dir)
        .env("RUST_LOG", "warn");
    if let Some(limit) = nofile {
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let rl = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    serve_process(command)
}

/// Two sandboxes (`sb-a` floods, `sb-b` is the bystander) allowed to reach `api.a.test`,
/// an HTTPS origin on this machine.
fn config(dir: &Path, ca: &TestCa, proxy: &str, api: &str) -> String {
    process_config(
        dir,
        proxy,
        api,
        &format!(
            r#"
[dns.hosts]
"api.a.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.0/8"]
[[egress.identities]]
id = "sb-a"
token = "{TOKEN}"
workspace = "ws"
allow_domains = ["api.a.test"]
[[egress.identities]]
id = "sb-b"
token = "{TOKEN_B}"
workspace = "ws"
allow_domains = ["api.a.test"]
"#
        ),
    )
    .replace(
        "[tls]\n",
        &format!(
            "[tls]\nupstream_ca_files = [{:?}]\n",
            ca.pem_path.display().to_string()
        ),
    )
}

struct Env {
    served: Served,
    origin: Origin,
    ca_pem: Vec<u8>,
    _ca: TestCa,
    _dir: tempfile::TempDir,
}

async fn start(proxy: &str, api: &str, nofile: Option<u64>) -> Env {
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path(), &config(dir.path(), &ca, proxy, api), nofile);
    let ca_pem = std::fs::read(dir.path().join("certs/ca.pem")).unwrap();
    Env {
        served,
        origin,
        ca_pem,
        _ca: ca,
        _dir: dir,
    }
}

impl Env {
    /// A normal request through the proxy as `id`, on a connection of its own.
    async fn proxied(&self, id: &str, token: &str) -> Result<u16, String> {
        let client = reqwest::Client::builder()
            .proxy(
                reqwest::Proxy::all(format!("http://{id}:{token}@{}", self.served.proxy)).unwrap(),
            )
            .tls_certs_only([reqwest::Certificate::from_pem(&self.ca_pem).unwrap()])
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let url = format!("https://api.a.test:{}/normal", self.origin.port());
        match client.get(url).send().await {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    async fn healthz(&self) -> Result<u16, String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        match client
            .get(format!("http://{}/healthz", self.served.api))
            .send()
            .await
        {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    /// An intercepted tunnel as `id` with TLS up (so it has upgraded), or the refusal.
    async fn tunnel(
        &self,
        id: &str,
        token: &str,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, (u16, String)> {
        let stream = connect_tunnel(
            self.served.proxy,
            &format!("api.a.test:{}", self.origin.port()),
            Some((id, token)),
        )
        .await?;
        tls_over(stream, &self.ca_pem, "api.a.test", &[b"http/1.1"])
            .await
            .map_err(|e| (0, e.to_string()))
    }
}

/// One request on an open tunnel: the status line.
async fn request_on<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    tls: &mut S,
    port: u16,
) -> String {
    tls.write_all(format!("GET /in-tunnel HTTP/1.1\r\nhost: api.a.test:{port}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf))
        .await
        .expect("an answer in time")
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// A TCP connection from `source` (another loopback address than the bystanders').
async fn connect_from(source: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{source}:0").parse().unwrap())?;
    socket.connect(to).await
}

/// Tunnels count against `max_connections` for as long as they are open: once the cap is
/// reached by tunnels that have upgraded, a new CONNECT gets 503 `overloaded`, the open
/// tunnels keep working, `/healthz` answers, and closing tunnels frees their places.
#[tokio::test]
async fn upgraded_tunnels_hold_their_connection_permit() {
    let env = start(
        "max_connections = 12\nmax_tunnels_per_identity = 8",
        "",
        None,
    )
    .await;
    // Each sandbox may hold fewer than `max_connections`: together they fill it.
    let mut open = Vec::new();
    for (id, token, count) in [("sb-a", TOKEN, 8), ("sb-b", TOKEN_B, 4)] {
        for _ in 0..count {
            open.push(env.tunnel(id, token).await.expect("a tunnel under the cap"));
        }
    }
    match env.tunnel("sb-b", TOKEN_B).await {
        Err((503, text)) => assert!(text.contains("overloaded"), "{text}"),
        Err(other) => panic!("expected 503 overloaded, got {other:?}"),
        Ok(_) => panic!("a 13th tunnel was accepted over max_connections = 12"),
    }
    assert_eq!(env.healthz().await, Ok(200));
    let port = env.origin.port();
    assert!(request_on(&mut open[0], port)
        .await
        .starts_with("HTTP/1.1 200"));
    assert!(request_on(&mut open[11], port)
        .await
        .starts_with("HTTP/1.1 200"));
    open.truncate(6);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match env.proxied("sb-b", TOKEN_B).await {
            Ok(200) => break,
            other => assert!(
                Instant::now() < deadline,
                "places were not freed: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One sandbox cannot take every tunnel: past `max_tunnels_per_identity` its CONNECTs get
/// 429 `too_many_tunnels`, while another sandbox's requests and `/healthz` go on, even
/// under a descriptor limit far below what the flood would use.
#[tokio::test]
async fn one_identity_cannot_take_every_tunnel() {
    let env = start(
        "max_connections = 300\nmax_tunnels_per_identity = 40",
        "",
        Some(512),
    )
    .await;
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..400 {
        match env.tunnel("sb-a", TOKEN).await {
            Ok(tls) => open.push(tls),
            Err((429, text)) => {
                assert!(text.contains("too_many_tunnels"), "{text}");
                refused += 1;
            }
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
    }
    assert_eq!(open.len(), 40, "sb-a held more tunnels than its cap");
    assert_eq!(refused, 360);
    assert_eq!(env.proxied("sb-b", TOKEN_B).await, Ok(200));
    assert_eq!(env.healthz().await, Ok(200));
    let port = env.origin.port();
    assert!(request_on(&mut open[39], port)
        .await
        .starts_with("HTTP/1.1 200"));
    // A closed tunnel gives its place back.
    open.pop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(env.tunnel("sb-a", TOKEN).await.is_ok());
}

/// Idle and slow-header connections to the API from one address: past the per-address cap
/// they are turned away at once, the ones held are closed after the header-read timeout, and
/// meanwhile `/healthz` and the proxy answer everyone else, under a descriptor limit the
/// flood alone would exceed.
#[tokio::test]
async fn idle_and_slow_header_api_floods_do_not_starve_anyone() {
    let env = start(
        "",
        "max_connections = 2000\nmax_connections_per_ip = 32\nheader_read_timeout_secs = 2",
        Some(512),
    )
    .await;
    let api = env.served.api;
    let mut flood = Vec::new();
    for i in 0..1500 {
        let Ok(mut stream) = connect_from("127.0.0.2", api).await else {
            continue;
        };
        if i % 3 == 0 {
            // Slow header: a request line, then nothing more for now.
            let _ = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
                .await;
        }
        flood.push(stream);
    }
    assert!(
        flood.len() > 1000,
        "the flood could not even connect: {}",
        flood.len()
    );
    for _ in 0..3 {
        assert_eq!(env.healthz().await, Ok(200), "healthz during the API flood");
        assert_eq!(
            env.proxied("sb-b", TOKEN_B).await,
            Ok(200),
            "proxy during the API flood"
        );
    }
    // Slow-header senders keep dribbling; the server must still close them.
    for stream in flood.iter_mut().step_by(3) {
        let _ = stream.write_all(b"x-slow: 1\r\n").await;
    }
    // Everything the flood holds is closed within the header-read timeout (plus slack):
    // shed connections at once with a 503, held ones when their head is late.
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut shed = 0;
    for mut stream in flood {
        let mut buf = Vec::new();
        let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(10);
        let read = tokio::time::timeout(left, stream.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "a flood connection was still open after the header-read timeout"
        );
        if buf.starts_with(b"HTTP/1.1 503") {
            shed += 1;
        }
    }
    assert!(
        shed >= 1000,
        "over-cap connections were not turned away with 503 ({shed})"
    );
    assert_eq!(env.healthz().await, Ok(200));
}

/// A connection flood to the proxy port with no request at all: each one is closed after the
/// header-read timeout, and the flood never keeps another sandbox out for longer.
#[tokio::test]
async fn idle_proxy_connections_are_closed_after_the_header_read_timeout() {
    let env = start(
        "header_read_timeout_secs = 1\nmax_connections = 200",
        "",
        Some(512),
    )
    .await;
    let mut idle = Vec::new();
    for _ in 0..150 {
        idle.push(TcpStream::connect(env.served.proxy).await.unwrap());
    }
    assert_eq!(env.proxied("sb-b", TOKEN_B).await, Ok(200));
    for mut stream in idle {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(4), stream.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "an idle proxy connection outlived the header-read timeout"
        );
    }
    assert_eq!(env.healthz().await, Ok(200));
}

/// curl (a real client) through the proxy as `id` to the origin, trusting sandgate's CA:
/// `(http_code, http_connect)` as curl prints them (`http_code` is `000` when the CONNECT
/// itself was refused; `http_connect` is the CONNECT's own status), and how long it took.
async fn curl(env: &Env, id: &str, token: &str) -> (String, String, Duration) {
    let ca = env._dir.path().join("certs/ca.pem");
    let proxy = format!("http://{id}:{token}@{}", env.served.proxy);
    let url = format!("https://api.a.test:{}/normal", env.origin.port());
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-m", "10"])
            .args(["-w", "%{http_code} %{http_connect}"])
            .arg("--cacert")
            .arg(&ca)
            .args(["-x", &proxy, &url])
            .output()
            .expect("curl runs")
    })
    .await
    .unwrap();
    let took = started.elapsed();
    let out = String::from_utf8_lossy(&output.stdout).to_string();
    let mut codes = out.split_whitespace();
    let code = codes.next().unwrap_or("").to_string();
    let connect = codes.next().unwrap_or("").to_string();
    eprintln!(
        "curl as {id}: {out} in {took:?}; {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    (code, connect, took)
}

/// With only `max_connections` set (100), one sandbox cannot hold every connection: its
/// share of tunnels is derived from the cap and below it, so it is refused (429, at once)
/// while another sandbox still gets through promptly; and once the proxy is full, a
/// connection turned away for capacity gets its 503 promptly, as an answer curl reads.
#[tokio::test]
async fn by_default_one_sandbox_cannot_hold_every_connection() {
    if which("curl").is_none() {
        assert!(!in_ci(), "curl is needed");
        eprintln!("SKIPPED: curl is not installed");
        return;
    }
    let env = start("max_connections = 100", "", Some(1024)).await;
    let mut open = Vec::new();
    let mut refusal = None;
    for _ in 0..150 {
        let started = Instant::now();
        match env.tunnel("sb-a", TOKEN).await {
            Ok(tls) => open.push(tls),
            Err(e) => {
                refusal = Some((e, started.elapsed()));
                break;
            }
        }
    }
    let ((status, text), took) = refusal.expect("sb-a was never refused a tunnel");
    assert_eq!(
        status, 429,
        "sb-a was refused, but not for its own share: {text}"
    );
    assert!(text.contains("too_many_tunnels"), "{text}");
    assert!(took < Duration::from_secs(2), "the 429 took {took:?}");
    assert_eq!(open.len(), 25, "sb-a's share of max_connections = 100");

    // sb-b: a real client, through at once.
    let (code, _, took) = curl(&env, "sb-b", TOKEN_B).await;
    assert_eq!(code, "200");
    assert!(took < Duration::from_secs(3), "sb-b waited {took:?}");
    assert_eq!(env.healthz().await, Ok(200));
    let port = env.origin.port();
    assert!(request_on(&mut open[24], port)
        .await
        .starts_with("HTTP/1.1 200"));

    // Fill the rest with connections that send nothing: now the proxy is full, and sb-b's
    // CONNECT is answered 503 at once (not reset, not left waiting).
    let mut idle = Vec::new();
    for _ in open.len()..100 {
        idle.push(TcpStream::connect(env.served.proxy).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let (code, connect, took) = curl(&env, "sb-b", TOKEN_B).await;
        assert_eq!(
            (code.as_str(), connect.as_str()),
            ("000", "503"),
            "a full proxy must answer 503 to the CONNECT"
        );
        assert!(took < Duration::from_secs(3), "the 503 took {took:?}");
    }
    drop(idle);
}
