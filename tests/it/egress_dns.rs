//! The dialed address is the vetted one, against a resolver whose answer changes.
//!
//! The real `sandgate serve` binary runs in its own mount namespace with a private
//! `/etc/hosts` (bind-mounted from a file the test rewrites), so the system resolver it uses
//! (glibc, which reads `/etc/hosts` on every lookup) answers differently from one call to the
//! next: a DNS-rebinding name, with no fake anywhere. Needs root (`unshare --mount`).

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");

/// `sandgate serve` with `hosts` bind-mounted over `/etc/hosts` in a mount namespace of
/// its own.
fn serve(dir: &Path, config: &str, hosts: &Path) -> Served {
    let config_path = dir.join("sandgate.toml");
    std::fs::write(&config_path, config).unwrap();
    let script = format!(
        "mount --bind {} /etc/hosts && exec {BIN} serve --config {}",
        hosts.display(),
        config_path.display()
    );
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .current_dir(dir)
        .env("RUST_LOG", "info");
    serve_process(command)
}

/// A TLS origin on `addr` that counts the connections it accepts and answers `who` to any
/// request.
async fn origin(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    who: &'static str,
) -> Arc<AtomicUsize> {
    let count: Arc<AtomicUsize> = Arc::default();
    let counter = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |_req| async move {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from(who)),
                    ))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    count
}

/// Listeners on 127.0.0.1:P and 127.0.0.2:P for one port P.
async fn twin_listeners() -> (TcpListener, TcpListener) {
    for _ in 0..50 {
        let good = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = good.local_addr().unwrap().port();
        if let Ok(evil) = TcpListener::bind(("127.0.0.2", port)).await {
            return (good, evil);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

fn config(dir: &Path, ca: &TestCa) -> String {
    // An address-based rule: rebind.test may only be reached at 127.0.0.1.
    let policy = r#"package sandgate.egress
import rego.v1

deny contains "rebind.test is allowed at 127.0.0.1 only" if {
	input.destination.host == "rebind.test"
	input.destination.ip != null
	input.destination.ip != "127.0.0.1"
}
"#;
    let config = process_config(
        dir,
        "",
        "",
        &format!(
            r#"
[dns]
cache_ttl_secs = 0
[egress]
allow_private = ["127.0.0.0/8"]
[[egress.identities]]
id = "sb-a"
token = "{TOKEN}"
workspace = "ws-a"
allow_domains = ["rebind.test", "self.test"]
"#
        ),
    )
    .replace(
        "[tls]\n",
        &format!(
            "[tls]\nupstream_ca_files = [{:?}]\n",
            ca.pem_path.display().to_string()
        ),
    );
    std::fs::write(dir.join("policies/pinned_ip.rego"), policy).unwrap();
    config
}

#[tokio::test]
async fn a_name_whose_answer_changes_is_dialed_at_the_vetted_address() {
    if !root_or_skip("a_name_whose_answer_changes_is_dialed_at_the_vetted_address") {
        return;
    }
    init();
    let ca = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 rebind.test\n127.0.0.2 self.test\n").unwrap();
    let tls = ca.server_config(&["rebind.test"]);
    let (good, evil) = twin_listeners().await;
    let port = good.local_addr().unwrap().port();
    let good = origin(good, tls.clone(), "good").await;
    let evil = origin(evil, tls, "evil").await;
    let gw = serve(dir.path(), &config(dir.path(), &ca), &hosts);
    let ca_pem = std::fs::read(dir.path().join("certs/ca.pem")).unwrap();

    // The tunnel is decided on rebind.test = 127.0.0.1 ...
    let stream = connect_tunnel(
        gw.proxy,
        &format!("rebind.test:{port}"),
        Some(("sb-a", TOKEN)),
    )
    .await
    .expect("CONNECT allowed");
    let mut tls = tls_over(stream, &ca_pem, "rebind.test", &[b"http/1.1"])
        .await
        .unwrap();
    // ... then the name moves to 127.0.0.2 (which the policy would refuse) before the
    // first request inside the tunnel makes sandgate dial.
    std::fs::write(&hosts, "127.0.0.2 rebind.test\n127.0.0.2 self.test\n").unwrap();
    tls.write_all(
        format!("GET /x HTTP/1.1\r\nhost: rebind.test:{port}\r\nconnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("good"), "{answer}");
    assert_eq!(
        evil.load(Ordering::SeqCst),
        0,
        "sandgate dialed the address the name moved to"
    );
    assert_eq!(good.load(Ordering::SeqCst), 1);

    // The decision record names the address that was dialed.
    let deadline = Instant::now() + Duration::from_secs(5);
    let record = loop {
        let text = std::fs::read_to_string(dir.path().join("decisions.jsonl")).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|r| r["phase"] == "request" && r["host"] == "rebind.test");
        if let Some(record) = found {
            break record;
        }
        assert!(Instant::now() < deadline, "no request record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(record["ip"], "127.0.0.1", "{record}");

    // "sandgate itself" holds on the dial too: self.test is vetted at 127.0.0.2 on the API's
    // port, then moves to 127.0.0.1, where sandgate's API listens. Plain HTTP inside the
    // tunnel would show the API's answer if sandgate dialed itself.
    let api_port = gw.api.port();
    let mut tunnel = connect_tunnel(
        gw.proxy,
        &format!("self.test:{api_port}"),
        Some(("sb-a", TOKEN)),
    )
    .await
    .expect("CONNECT allowed while self.test is 127.0.0.2");
    std::fs::write(&hosts, "127.0.0.2 rebind.test\n127.0.0.1 self.test\n").unwrap();
    tunnel
        .write_all(
            format!(
                "GET /healthz HTTP/1.1\r\nhost: self.test:{api_port}\r\nconnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    tunnel.read_to_string(&mut answer).await.unwrap_or_default();
    assert!(
        answer.starts_with("HTTP/1.1 502"),
        "sandgate reached itself: {answer}"
    );
    assert!(!answer.contains("generation"), "{answer}");
    drop(gw);
}
