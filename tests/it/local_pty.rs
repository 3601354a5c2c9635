//! Interactive work in local sandboxes through a real gateway: terminal sessions over the
//! `/v1/sandboxes/{id}/pty` WebSocket (commands, resize, Ctrl-C, exit code), `sandgate
//! sandbox shell` driven under a real pseudo-terminal by python's `pty` module, stdin fed to
//! a running exec, and the action policy refusing `pty` and `stdin` while allowing `exec`.
//!
//! Needs root, as every local sandbox (`local_provider::start` decides and skips).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::local_provider::{start, Env, TOKEN_A};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a terminal session; the socket, or the refusal's status and body.
async fn open(env: &Env, token: &str, id: &str, query: &str) -> Result<Ws, (u16, Value)> {
    let url = env
        .gw
        .api(&format!("/v1/sandboxes/{id}/pty?{query}"))
        .replacen("http://", "ws://", 1);
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().clone().unwrap_or_default();
            Err((
                response.status().as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            ))
        }
        Err(e) => panic!("WebSocket handshake failed: {e}"),
    }
}

/// A session's output so far, read frame by frame.
struct Session {
    ws: Ws,
    output: String,
    texts: Vec<Value>,
    closed: bool,
}

impl Session {
    async fn send(&mut self, bytes: &str) {
        let frame = Message::Binary(bytes.as_bytes().to_vec().into());
        self.ws.send(frame).await.unwrap();
    }

    async fn control(&mut self, value: Value) {
        self.ws
            .send(Message::Text(value.to_string().into()))
            .await
            .unwrap();
    }

    /// Reads until `needle` appears in the output after `from`; the output's length then.
    async fn expect(&mut self, needle: &str, from: usize) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(at) = self.output[from..].find(needle) {
                return from + at + needle.len();
            }
            assert!(
                !self.closed,
                "closed before {needle:?}; output: {:?}",
                self.output
            );
            let next = tokio::time::timeout_at(deadline, self.ws.next()).await;
            let Ok(frame) = next else {
                panic!("no {needle:?} within 20 s; output: {:?}", self.output);
            };
            self.take(frame);
        }
    }

    fn take(&mut self, frame: Option<Result<Message, tungstenite::Error>>) {
        match frame {
            Some(Ok(Message::Binary(b))) => self.output.push_str(&String::from_utf8_lossy(&b)),
            Some(Ok(Message::Text(t))) => self.texts.push(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => self.closed = true,
            Some(Ok(_)) => {}
        }
    }

    /// Reads to the end; the `exit` frame.
    async fn exit(&mut self) -> Value {
        while !self.closed {
            let frame = tokio::time::timeout(Duration::from_secs(20), self.ws.next())
                .await
                .expect("the session did not end");
            self.take(frame);
        }
        let exit = self.texts.iter().find(|t| t["type"] == "exit");
        exit.cloned()
            .unwrap_or_else(|| panic!("no exit frame: {:?}", self.texts))
    }
}

#[tokio::test]
async fn terminal_session_runs_commands_resizes_and_takes_ctrl_c() {
    let Some(env) = start("pty_session", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    // A non-WebSocket request is told what to do.
    let plain = env
        .http
        .get(env.gw.api(&format!("/v1/sandboxes/{id}/pty")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 426);
    let ws = open(&env, TOKEN_A, id, "rows=30&cols=100").await.unwrap();
    let mut s = Session {
        ws,
        output: String::new(),
        texts: Vec::new(),
        closed: false,
    };
    let first = tokio::time::timeout(Duration::from_secs(20), s.ws.next())
        .await
        .unwrap();
    s.take(first);
    assert_eq!(s.texts[0]["type"], "started", "{:?}", s.texts);
    assert!(s.texts[0]["exec_id"].as_str().unwrap().starts_with("ex-"));

    // A terminal: `tty` names one and the size is the one asked for.
    s.send("test -t 0 && echo is-a-tty-$((6*7)); stty size\n")
        .await;
    let at = s.expect("is-a-tty-42", 0).await;
    let at = s.expect("30 100", at).await;

    s.control(json!({"type": "resize", "rows": 41, "cols": 133}))
        .await;
    s.send("stty size\n").await;
    let at = s.expect("41 133", at).await;

    // Ctrl-C as typed: the terminal turns it into SIGINT for the foreground job.
    s.send("sleep 60; echo not-interrupted\n").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.send("\x03").await;
    s.send("echo status-$?\n").await;
    let at = s.expect("status-130", at).await;
    // And as a control frame.
    s.send("sleep 60\n").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.control(json!({"type": "signal", "signal": "INT"})).await;
    s.send("echo again-$?\n").await;
    let at = s.expect("again-130", at).await;

    // A bad control frame is answered, and the session goes on.
    s.control(json!({"type": "resize", "rows": 0, "cols": 5}))
        .await;
    s.send("echo still-$((1+1))\n").await;
    s.expect("still-2", at).await;
    assert!(
        s.texts.iter().any(|t| t["type"] == "error"),
        "{:?}",
        s.texts
    );

    s.send("exit 7\n").await;
    let exit = s.exit().await;
    assert_eq!(exit["code"], 7, "{exit}");
    assert_eq!(exit["reason"], "exited", "{exit}");
}

#[tokio::test]
async fn closing_the_socket_kills_the_session() {
    let Some(env) = start("pty_close", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    let ws = open(&env, TOKEN_A, id, "argv=sh").await.unwrap();
    let mut s = Session {
        ws,
        output: String::new(),
        texts: Vec::new(),
        closed: false,
    };
    s.send("sleep 3600 & echo bg-$!\n").await;
    s.expect("bg-", 0).await;
    s.ws.close(None).await.unwrap();
    drop(s);
    // The session's whole tree is gone: no sleep left in the sandbox.
    let mut left = String::new();
    for _ in 0..50 {
        let events = env
            .exec_request(
                TOKEN_A,
                id,
                json!({"argv": ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"]}),
            )
            .await;
        left = events.text().await.unwrap();
        if !left.contains("sleep 3600") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // (The sandbox's init sleeps too, `sleep infinity`.)
    assert!(left.contains("sleep infinity"), "{left}");
    assert!(!left.contains("sleep 3600"), "{left}");
}

#[tokio::test]
async fn policy_that_allows_exec_but_not_pty_refuses_the_shell() {
    let data = json!({"sandgate": {"workspaces": {"ws-a": {
        "blocked_operations": ["pty", "stdin"],
    }}}});
    let Some(env) = start("pty_policy", vec![("data.json", data.to_string())]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    let ran = env
        .exec_request(TOKEN_A, id, json!({"argv": ["true"], "stdin": true}))
        .await;
    assert_eq!(ran.status(), 200);
    let lines = ran.text().await.unwrap();
    let started: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    let exec_id = started["exec_id"].as_str().unwrap().to_string();

    let Err((status, body)) = open(&env, TOKEN_A, id, "").await else {
        panic!("the policy let a shell open");
    };
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "policy_denied", "{body}");
    assert_eq!(body["error"]["details"]["operation"], "pty", "{body}");
    assert_eq!(
        body["error"]["details"]["reasons"][0], "operation pty is blocked in workspace ws-a",
        "{body}"
    );

    // The CLI prints the same refusal and exits 125.
    // (Async: the gateway answers on this test's runtime.)
    let out = tokio::process::Command::new(BIN)
        .args(["sandbox", "shell", id])
        .env("SANDGATE_URL", env.gw.api(""))
        .env("SANDGATE_TOKEN", TOKEN_A)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("policy_denied"), "{stderr}");

    let sent = env
        .http
        .post(
            env.gw
                .api(&format!("/v1/sandboxes/{id}/exec/{exec_id}/stdin")),
        )
        .bearer_auth(TOKEN_A)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 403);
    let body: Value = sent.json().await.unwrap();
    assert_eq!(body["error"]["details"]["operation"], "stdin", "{body}");
}

#[tokio::test]
async fn stdin_reaches_a_running_exec() {
    let Some(env) = start("exec_stdin", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap().to_string();
    let mut response = env
        .exec_request(
            TOKEN_A,
            &id,
            json!({"argv": ["sh", "-c", "read a; echo got-$a; cat; echo end"], "stdin": true, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    let started: Value = serde_json::from_slice(&first).unwrap();
    let exec_id = started["exec_id"].as_str().unwrap().to_string();
    let stdin = |body: &'static str, eof: bool| {
        let url = env.gw.api(&format!(
            "/v1/sandboxes/{id}/exec/{exec_id}/stdin?eof={eof}"
        ));
        let http = env.http.clone();
        async move {
            let r = http
                .post(url)
                .bearer_auth(TOKEN_A)
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = stdin("one\n", false).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["bytes"], 4);
    let (status, _) = stdin("two\nthree\n", true).await;
    assert_eq!(status, 202);
    let mut text = String::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let mut out = String::new();
    let mut code = None;
    for line in text.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        match event["type"].as_str() {
            Some("stdout") => out.push_str(event["text"].as_str().unwrap()),
            Some("exit") => code = event["code"].as_i64(),
            _ => {}
        }
    }
    assert_eq!(out, "got-one\ntwo\nthree\nend\n");
    assert_eq!(code, Some(0));
    // Ended: no such running exec any more.
    let (status, _) = stdin("late", false).await;
    assert_eq!(status, 404);

    // An exec started without stdin takes none (its stdin is empty, not waiting).
    let mut plain = env
        .exec_request(TOKEN_A, &id, json!({"argv": ["sleep", "5"]}))
        .await;
    let first = plain.chunk().await.unwrap().unwrap();
    let started: Value = serde_json::from_slice(&first).unwrap();
    let url = env.gw.api(&format!(
        "/v1/sandboxes/{id}/exec/{}/stdin",
        started["exec_id"].as_str().unwrap()
    ));
    let r = env
        .http
        .post(url)
        .bearer_auth(TOKEN_A)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
}

/// `sandgate sandbox shell` on a real pseudo-terminal (python's `pty`): commands, the
/// terminal's size and a resize, Ctrl-C typed, exit code, terminal settings restored.
const DRIVER: &str = r#"
import fcntl, json, os, select, struct, sys, termios, time

binary, sid = sys.argv[1], sys.argv[2]
master, slave = os.openpty()
def set_size(rows, cols):
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
set_size(30, 100)
before = termios.tcgetattr(slave)
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.execv(binary, [binary, "sandbox", "shell", sid])
buf = b""
def expect(needle, timeout=20):
    global buf
    deadline = time.time() + timeout
    while needle not in buf:
        left = deadline - time.time()
        if left <= 0:
            raise SystemExit("no %r in %r" % (needle, buf[-2000:]))
        ready, _, _ = select.select([master], [], [], left)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                raise SystemExit("ended before %r: %r" % (needle, buf[-2000:]))
            buf += chunk
    at = buf.index(needle) + len(needle)
    buf = buf[at:]
def send(data):
    os.write(master, data)

send(b"echo hello-$((6*7))\r")
expect(b"hello-42")
during = termios.tcgetattr(slave)
send(b"stty size\r")
expect(b"30 100")
set_size(40, 120)
time.sleep(1)
send(b"stty size\r")
expect(b"40 120")
send(b"sleep 60; echo not-interrupted\r")
time.sleep(1)
send(b"\x03")
send(b"echo status-$?\r")
expect(b"status-130")
send(b"exit 3\r")
_, status = os.waitpid(pid, 0)
after = termios.tcgetattr(slave)
print(json.dumps({
    "exit": os.waitstatus_to_exitcode(status),
    "raw_during": not (during[3] & termios.ICANON) and not (during[3] & termios.ECHO),
    "restored": after == before,
}))
"#;

#[tokio::test]
async fn sandbox_shell_on_a_real_terminal() {
    let Some(env) = start("pty_cli", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap().to_string();
    let url = env.gw.api("");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", DRIVER, BIN, &id])
            .env("SANDGATE_URL", url)
            .env("SANDGATE_TOKEN", TOKEN_A)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["exit"], 3, "{report}");
    assert_eq!(report["raw_during"], true, "{report}");
    assert_eq!(report["restored"], true, "{report}");
}

/// `user` on a terminal session, as on an exec: a user the pool declares (`root` in
/// `local_provider`'s config) is that uid on the terminal; another is refused before the
/// upgrade, naming the declared ones.
#[tokio::test]
async fn a_terminal_session_runs_as_a_declared_user_and_refuses_others() {
    let Some(env) = start("pty_user", vec![]).await else {
        return;
    };
    let id = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let query = "user=root&argv=sh&argv=-c&argv=echo%20uid%3D%24%28id%20-u%29";
    let ws = open(&env, TOKEN_A, &id, query)
        .await
        .expect("a session as root");
    let mut session = Session {
        ws,
        output: String::new(),
        texts: Vec::new(),
        closed: false,
    };
    session.expect("uid=0", 0).await;
    assert_eq!(session.exit().await["code"], 0);
    let (status, body) = open(&env, TOKEN_A, &id, "user=admin").await.err().unwrap();
    assert_eq!(status, 400, "{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"admin\" is not declared"), "{body:#}");
}

/// A TLS-terminating front for the API, as a deployment puts one (the API listener itself
/// speaks plain HTTP): accepts TLS with `config` and relays the bytes to `api`.
async fn tls_front(config: std::sync::Arc<rustls::ServerConfig>, api: std::net::SocketAddr) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut upstream) = tokio::net::TcpStream::connect(api).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
            });
        }
    });
    port
}

/// `sandgate sandbox shell` against an `https://` gateway URL: the session runs over
/// `wss://`, trusting the CA the CLI's HTTP calls trust (`SSL_CERT_FILE`), and refuses a
/// certificate it does not trust.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_shell_over_wss() {
    let Some(env) = start("pty_wss", vec![]).await else {
        return;
    };
    let id = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let ca = crate::common::TestCa::new();
    let port = tls_front(ca.server_config(&["localhost"]), env.gw.server.api_addr()).await;
    let shell = |trust: std::path::PathBuf| {
        let mut command = tokio::process::Command::new(BIN);
        command
            .args([
                "sandbox",
                "shell",
                &id,
                "--",
                "sh",
                "-c",
                "echo over-$((6*7)); exit 7",
            ])
            .env("SANDGATE_URL", format!("https://localhost:{port}"))
            .env("SANDGATE_TOKEN", TOKEN_A)
            .env_remove("SSL_CERT_DIR")
            .env("SSL_CERT_FILE", trust)
            .stdin(std::process::Stdio::null());
        command.output()
    };
    let out = shell(ca.pem_path.clone()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(7),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.contains("over-42"),
        "stdout: {stdout}\nstderr: {stderr}"
    );

    // A trust store without the front's CA: the session is refused, nothing runs.
    let other = crate::common::TestCa::new();
    let out = shell(other.pem_path.clone()).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(7), "{stderr}");
    assert!(
        stderr.to_ascii_lowercase().contains("certificate"),
        "{stderr}"
    );
}
