//! Refusals answered inside the tunnel (`[proxy] deny_mode = "in_tunnel"`, the default):
//! real curl, Python requests and git show the JSON reason for a refused HTTPS
//! destination, whose name is never resolved nor dialed; a client that insists on HTTP/2
//! (reqwest with prior knowledge, a raw hyper h2 connection) gets the same refusal on h2
//! streams, up to the tunnel's request cap; `deny_mode = "connect"` (config or policy)
//! restores the CONNECT 403; the per-identity leaf budget falls back to it; and the egress
//! records say why a workspace credential was not applied.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
/// The test's DNS server: the address `/etc/resolv.conf` names inside sandgate's namespace.
const DNS_ADDR: &str = "127.0.0.77:53";
const ADMIN: &str = "api-token-deny-0123456789";

/// A DNS server that records the raw queries it gets and answers each NXDOMAIN.
async fn dns_server() -> Arc<Mutex<Vec<Vec<u8>>>> {
    let socket = tokio::net::UdpSocket::bind(DNS_ADDR).await.unwrap();
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = seen.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            if n < 12 {
                continue;
            }
            sink.lock().unwrap().push(buf[..n].to_vec());
            let mut answer = buf[..n].to_vec();
            // QR, RD and RA set, RCODE 3 (NXDOMAIN); no answers.
            answer[2] = 0x81;
            answer[3] = 0x83;
            let _ = socket.send_to(&answer, peer).await;
        }
    });
    seen
}

/// Queries that asked for `label` (as it appears in a DNS question).
fn queries_for(seen: &Mutex<Vec<Vec<u8>>>, label: &str) -> usize {
    let seen = seen.lock().unwrap();
    seen.iter()
        .filter(|q| q.windows(label.len()).any(|w| w == label.as_bytes()))
        .count()
}

/// `sandgate serve` in a mount namespace whose `/etc/hosts` and `/etc/resolv.conf` are the
/// test's, so every name it resolves goes to the test's hosts file or DNS server.
fn serve(dir: &Path, config: &str) -> Served {
    let config_path = dir.join("sandgate.toml");
    std::fs::write(&config_path, config).unwrap();
    let (hosts, resolv) = (dir.join("hosts"), dir.join("resolv.conf"));
    let script = format!(
        "mount --bind {} /etc/hosts && mount --bind {} /etc/resolv.conf && exec {BIN} serve --config {}",
        hosts.display(),
        resolv.display(),
        config_path.display()
    );
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .current_dir(dir)
        .env("RUST_LOG", "info");
    serve_process(command)
}

async fn run(program: &str, args: &[&str], envs: &[(&str, String)]) -> (bool, String, String) {
    let out = tokio::process::Command::new(program)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const PYTHON: &str = r#"
import os, sys, requests
try:
    r = requests.get(sys.argv[1], proxies={"https": os.environ["PROXY"]}, verify=os.environ["CA"], timeout=10)
    print("status", r.status_code, r.json()["error"]["details"]["reason"])
    r.raise_for_status()
except Exception as e:
    print("exception:", e, file=sys.stderr)
    sys.exit(1)
"#;

#[tokio::test]
async fn curl_python_and_git_show_the_reason_and_the_name_is_never_resolved_nor_dialed() {
    if !root_or_skip("curl_python_and_git_show_the_reason") {
        return;
    }
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["dialed.test"]))).await;
    let dns = dns_server().await;
    let dir = tempfile::tempdir().unwrap();
    // dialed.test resolves to the test's origin, nowhere.test only through the test's DNS.
    std::fs::write(dir.path().join("hosts"), "127.0.0.1 dialed.test\n").unwrap();
    std::fs::write(
        dir.path().join("resolv.conf"),
        "nameserver 127.0.0.77\noptions timeout:1 attempts:1\n",
    )
    .unwrap();
    let extra = format!(
        "[egress]\nallow_private = [\"127.0.0.0/8\"]\n[[egress.identities]]\nid = \"sb-a\"\ntoken = \"{TOKEN}\"\nworkspace = \"ws-a\"\nallow_domains = [\"allowed-unknown.test\"]\n"
    );
    let gw = serve(dir.path(), &process_config(dir.path(), "", "", &extra));
    let ca_file = dir.path().join("certs/ca.pem");
    let proxy = format!("http://sb-a:{TOKEN}@{}", gw.proxy);
    let ca_arg = ca_file.display().to_string();

    // curl: the body is the refusal, with the reason, on an answered tunnel.
    let (ok, stdout, stderr) = run(
        "curl",
        &[
            "-sS",
            "--max-time",
            "10",
            "--proxy",
            &proxy,
            "--cacert",
            &ca_arg,
            "https://nowhere.test/x",
        ],
        &[],
    )
    .await;
    assert!(ok, "{stderr}");
    let body: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|_| panic!("{stdout}"));
    assert_eq!(body["error"]["code"], "egress_denied", "{body}");
    let details = &body["error"]["details"];
    assert_eq!(details["layer"], "egress", "{body}");
    assert_eq!(details["host"], "nowhere.test", "{body}");
    assert!(details["decision_id"].is_string(), "{body}");
    assert!(
        details["reason"]
            .as_str()
            .unwrap()
            .starts_with("sandgate's egress policy refuses nowhere.test:443 for this sandbox"),
        "{body}"
    );
    // curl on HTTP/2 (ALPN h2 inside the tunnel): the same refusal on an h2 stream.
    let (ok, stdout, stderr) = run(
        "curl",
        &[
            "-sS",
            "--http2",
            "--proxy",
            &proxy,
            "--cacert",
            &ca_arg,
            "-w",
            "\n%{http_version} %{http_code}",
            "https://nowhere.test/h2",
        ],
        &[],
    )
    .await;
    assert!(ok, "{stderr}");
    assert!(stdout.ends_with("\n2 403"), "{stdout}");
    assert!(stdout.contains("\"egress_denied\""), "{stdout}");
    // With --fail-with-body the status is the request's own.
    let (ok, stdout, stderr) = run(
        "curl",
        &[
            "-sS",
            "--fail-with-body",
            "--proxy",
            &proxy,
            "--cacert",
            &ca_arg,
            "https://nowhere.test/",
        ],
        &[],
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("returned error: 403"), "{stderr}");
    assert!(stdout.contains("\"egress_denied\""), "{stdout}");

    // Python requests: raise_for_status's exception text carries the reason.
    let (ok, stdout, stderr) = run(
        "python3",
        &["-c", PYTHON, "https://nowhere.test/api"],
        &[("PROXY", proxy.clone()), ("CA", ca_arg.clone())],
    )
    .await;
    assert!(!ok, "{stdout}");
    assert!(
        stdout.contains("status 403 sandgate's egress policy refuses nowhere.test:443"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "403 Client Error: sandgate's egress policy refuses nowhere.test:443 for this sandbox"
        ),
        "{stderr}"
    );

    // git: prints a text/plain body as `remote:` lines.
    let (ok, _, stderr) = run(
        "git",
        &["ls-remote", "https://nowhere.test/org/repo.git"],
        &[
            ("https_proxy", proxy.clone()),
            ("GIT_SSL_CAINFO", ca_arg.clone()),
            ("GIT_TERMINAL_PROMPT", "0".into()),
            ("HOME", dir.path().display().to_string()),
        ],
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("remote: {\"error\":{\"code\":\"egress_denied\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("sandgate's egress policy refuses nowhere.test:443"),
        "{stderr}"
    );

    // A name the hosts file maps to the test's origin: refused, and never dialed.
    let url = format!("https://dialed.test:{}/", origin.port());
    let (ok, stdout, stderr) = run(
        "curl",
        &["-sS", "--proxy", &proxy, "--cacert", &ca_arg, &url],
        &[],
    )
    .await;
    assert!(
        ok && stdout.contains("\"egress_denied\""),
        "{stdout} {stderr}"
    );
    assert_eq!(
        origin.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(
        queries_for(&dns, "nowhere"),
        0,
        "a refused name was looked up"
    );

    // The DNS server does get the names sandgate resolves: an allowed name it cannot
    // resolve (so the zero above is not a server nobody asks).
    let (_, stdout, _) = run(
        "curl",
        &[
            "-sS",
            "--proxy",
            &proxy,
            "--cacert",
            &ca_arg,
            "https://allowed-unknown.test/",
        ],
        &[],
    )
    .await;
    let _ = stdout;
    assert!(
        queries_for(&dns, "allowed-unknown") >= 1,
        "the DNS server saw no query"
    );

    // The record says how the refusal was answered.
    let text = std::fs::read_to_string(dir.path().join("decisions.jsonl")).unwrap();
    let record = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["kind"] == "egress" && r["host"] == "nowhere.test")
        .expect("a record for nowhere.test");
    assert_eq!(record["decision"], "deny", "{record}");
    assert_eq!(record["deny_mode"], "in_tunnel", "{record}");
    assert!(record["ip"].is_null(), "{record}");
}

fn in_tunnel(proxy_toml: &str) -> GatewayOptions {
    GatewayOptions {
        proxy_toml: proxy_toml.to_string(),
        ..GatewayOptions::default()
    }
}

/// One HTTP/1.1 request on `stream`, read to its end: the status line and the body.
async fn request<S>(stream: &mut S, host: &str, close: bool) -> (String, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let connection = if close { "close" } else { "keep-alive" };
    let head = format!("GET /p HTTP/1.1\r\nhost: {host}\r\nconnection: {connection}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed mid-head");
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap();
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    (head, String::from_utf8(body).unwrap())
}

#[tokio::test]
async fn deny_mode_connect_in_config_or_policy_restores_the_connect_403() {
    let policy = "package sandgate.egress\nimport rego.v1\n\ndeny_mode := \"connect\" if input.destination.host == \"api.c.test\"\n";
    let gw = Gateway::start(GatewayOptions {
        extra_policies: vec![("deny_mode.rego", policy.to_string())],
        ..in_tunnel("deny_mode = \"in_tunnel\"")
    })
    .await;
    let proxy = gw.server.proxy_addr();
    // In the tunnel: TLS on a leaf for the name, each request answered 403 with the reason
    // (HTTP/1.1 here: the client offers nothing else; h2 is tested below).
    let mut tls = gw
        .tls_tunnel("sb-a", "api.b.test", 443, "api.b.test", &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (head, body) = request(&mut tls, "api.b.test", false).await;
    assert!(
        head.starts_with("HTTP/1.1 403 sandgate's egress policy refuses api.b.test:443"),
        "{head}"
    );
    assert!(head.contains("x-sandgate-error: egress_denied"), "{head}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["details"]["layer"], "egress");
    // Plain HTTP inside a refused tunnel: the same answer, up to the request cap.
    let mut plain = connect_tunnel(proxy, "api.b.test:80", Some(("sb-a", TOKEN)))
        .await
        .unwrap();
    for n in 1..=16 {
        let (head, _) = request(&mut plain, "api.b.test", false).await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        assert_eq!(
            head.contains("connection: close"),
            n == 16,
            "request {n}: {head}"
        );
    }
    let mut rest = Vec::new();
    plain.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "the tunnel closes after its last request");
    // The policy picks the CONNECT 403 for api.c.test.
    let err = connect_tunnel(proxy, "api.c.test:443", Some(("sb-a", TOKEN)))
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{}", err.1);
    assert!(err.1.contains("\"egress_denied\""), "{}", err.1);
    gw.server.shutdown();

    // And so does the config.
    let gw = Gateway::start(in_tunnel("deny_mode = \"connect\"")).await;
    let err = connect_tunnel(
        gw.server.proxy_addr(),
        "api.b.test:443",
        Some(("sb-a", TOKEN)),
    )
    .await
    .unwrap_err();
    assert_eq!(err.0, 403, "{}", err.1);
    let records = gw.decisions(1).await;
    assert_eq!(records[0]["deny_mode"], "connect", "{}", records[0]);
    gw.server.shutdown();
}

#[tokio::test]
async fn past_the_leaf_budget_a_refusal_is_the_connect_403() {
    let gw = Gateway::start(in_tunnel(
        "deny_mode = \"in_tunnel\"\ndeny_leaves_per_minute = 3",
    ))
    .await;
    let proxy = gw.server.proxy_addr();
    // r1 is minted (a handshake) and answered; r2 and r3 only take their share.
    let stream = connect_tunnel(proxy, "r1.random.test:443", Some(("sb-a", TOKEN))).await;
    let stream = stream.expect("r1");
    let mut tls = tls_over(
        stream,
        &gw.sandgate_ca_pem,
        "r1.random.test",
        &[b"http/1.1"],
    )
    .await
    .unwrap();
    let (head, _) = request(&mut tls, "r1.random.test", true).await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
    for name in ["r2.random.test:443", "r3.random.test:443"] {
        connect_tunnel(proxy, name, Some(("sb-a", TOKEN)))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
    let err = connect_tunnel(proxy, "r4.random.test:443", Some(("sb-a", TOKEN)))
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{}", err.1);
    // A name whose leaf is cached costs nothing.
    let again = connect_tunnel(proxy, "r1.random.test:443", Some(("sb-a", TOKEN))).await;
    assert!(again.is_ok(), "a cached leaf is not counted");
    let records = gw.decisions(5).await;
    let r4 = records
        .iter()
        .find(|r| r["host"] == "r4.random.test")
        .unwrap();
    assert_eq!(r4["deny_mode"], "connect", "{r4}");
    assert!(
        r4["reasons"].to_string().contains("deny_leaves_per_minute"),
        "{r4}"
    );
    gw.server.shutdown();
}

#[tokio::test]
async fn records_say_why_a_credential_for_the_host_was_not_applied() {
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let port = origin.port();
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("s"), "s3cr3t-notes-0123").unwrap();
    let s = secrets.path().join("s").display().to_string();
    let credential = |name: &str, header: &str, destination: String| {
        format!(
            "[[credentials]]\nworkspace = \"ws-a\"\nname = \"{name}\"\nsecret_file = {s:?}\ndestinations = [{destination}]\napply = {{ type = \"header\", name = \"{header}\", template = \"{{secret}}\" }}\n"
        )
    };
    let extra_toml = [
        credential("default-port", "x-a", "{ host = \"api.a.test\" }".into()),
        credential(
            "get-only",
            "x-b",
            format!("{{ host = \"api.a.test\", ports = [{port}], methods = [\"GET\"] }}"),
        ),
        credential(
            "api-only",
            "x-c",
            format!("{{ host = \"api.a.test\", ports = [{port}], path_prefix = \"/api\" }}"),
        ),
        credential("elsewhere", "x-d", "{ host = \"api.b.test\" }".into()),
        format!(
            "[[api.tokens]]\ntoken = \"{ADMIN}\"\nprincipal = \"alice\"\nworkspace = \"ws-a\"\n"
        ),
    ]
    .concat();
    let mut identity = IdentitySpec::new("sb-a", "ws-a", vec!["api.a.test"]);
    identity.credentials = vec!["default-port", "get-only", "api-only", "elsewhere"];
    let gw = Gateway::start(GatewayOptions {
        identities: vec![identity],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_toml,
        ..GatewayOptions::default()
    })
    .await;
    let client = gw.client("sb-a", true);
    let base = format!("https://api.a.test:{port}");
    let get = client.get(format!("{base}/x")).send().await.unwrap();
    assert_eq!(get.status(), 200);
    let post = client
        .post(format!("{base}/api/y"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 200);
    let records = gw
        .log_records(2, |r| r["kind"] == "egress" && r["phase"] == "request")
        .await;
    let notes = |method: &str| {
        let r = records.iter().find(|r| r["method"] == method).unwrap();
        (r["credentials"].clone(), r["credential_notes"].clone())
    };
    let port_note = format!(
        "credential \"default-port\": port {port} not in ports [443] (ports default to [443])"
    );
    let (applied, get_notes) = notes("GET");
    assert_eq!(applied, serde_json::json!(["get-only"]));
    assert_eq!(
        get_notes,
        serde_json::json!([
            port_note,
            "credential \"api-only\": path /x outside path_prefix /api"
        ])
    );
    let (applied, post_notes) = notes("POST");
    assert_eq!(applied, serde_json::json!(["api-only"]));
    assert_eq!(
        post_notes,
        serde_json::json!([
            port_note,
            "credential \"get-only\": method POST not in methods [GET]"
        ])
    );
    assert!(!records.iter().any(|r| r.to_string().contains("s3cr3t")));

    // A POST with get-only's placeholder in its own slot: refused, and the method rule is
    // blamed, not the slot.
    let env: serde_json::Value = reqwest::Client::new()
        .get(gw.api("/v1/identities/sb-a/env"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let placeholder = env["placeholders"]["get-only"]
        .as_str()
        .unwrap()
        .to_string();
    let refused = client
        .post(format!("{base}/api/z"))
        .header("x-b", placeholder)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let text = refused.text().await.unwrap();
    assert!(text.contains("the method POST is not allowed"), "{text}");
    assert!(!text.contains("declared slot"), "{text}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    gw.server.shutdown();
}

/// The refusal's JSON, as a client reads it from a body.
fn refusal_json(body: &[u8]) -> serde_json::Value {
    let body: serde_json::Value = serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(body)));
    assert_eq!(body["error"]["code"], "egress_denied", "{body}");
    assert_eq!(body["error"]["details"]["host"], "api.b.test", "{body}");
    let reason = body["error"]["details"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("sandgate's egress policy refuses api.b.test:443"),
        "{body}"
    );
    body
}

#[tokio::test]
async fn h2_clients_get_the_refusal_on_h2_streams_up_to_the_cap_and_revocation() {
    use http_body_util::BodyExt;
    let gw = Gateway::start(in_tunnel("deny_mode = \"in_tunnel\"")).await;
    // reqwest speaking nothing but h2 (ALPN `h2` alone) through the proxy.
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(gw.proxy_url("sb-a", TOKEN)).unwrap())
        .tls_certs_only([reqwest::Certificate::from_pem(&gw.sandgate_ca_pem).unwrap()])
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = client.get("https://api.b.test/x").send().await.unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 403);
    assert_eq!(response.headers()["x-sandgate-error"], "egress_denied");
    refusal_json(&response.bytes().await.unwrap());

    // A raw h2 connection on one tunnel: its first 16 requests are answered, then it ends.
    let tls = gw
        .tls_tunnel(
            "sb-a",
            "api.b.test",
            443,
            "api.b.test",
            &[b"h2", b"http/1.1"],
        )
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    let ended = tokio::spawn(conn);
    let get = || {
        http::Request::get("https://api.b.test/p")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    for n in 1..=16 {
        let response = send
            .send_request(get())
            .await
            .unwrap_or_else(|e| panic!("request {n}: {e}"));
        assert_eq!(response.status(), 403, "request {n}");
        assert_eq!(response.headers()["x-sandgate-error"], "egress_denied");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        refusal_json(&body);
    }
    let end = tokio::time::timeout(Duration::from_secs(5), ended).await;
    assert!(end.is_ok(), "the h2 connection outlived its 16th request");
    assert!(send.send_request(get()).await.is_err(), "a 17th request");

    // Another h2 tunnel ends when the sandbox's identity is revoked.
    let tls = gw
        .tls_tunnel("sb-a", "api.b.test", 443, "api.b.test", &[b"h2"])
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    let ended = tokio::spawn(conn);
    assert_eq!(send.send_request(get()).await.unwrap().status(), 403);
    gw.server.egress.identities.revoke("sb-a");
    let end = tokio::time::timeout(Duration::from_secs(5), ended).await;
    assert!(end.is_ok(), "the h2 tunnel outlived its identity");
    gw.server.shutdown();
}
