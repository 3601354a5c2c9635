//! The `sandgate` binary as a user runs it: `serve` with a config file, `ca`, `policy`, and
//! what it prints (no secret ever reaches its logs).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");

/// A running `sandgate serve` whose stdout and stderr are captured line by line.
struct Running {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    proxy: String,
    api: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn capture(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

fn serve(dir: &Path, config: &str, envs: &[(&str, &str)]) -> Running {
    let config_path = dir.join("sandgate.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config_path)
        .current_dir(dir)
        .env("RUST_LOG", "debug")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = capture(child.stdout.take().unwrap());
    let stderr = capture(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = stderr.lock().unwrap().iter().find_map(|l| {
            l.strip_prefix("sandgate: proxy on http://")
                .map(str::to_string)
        });
        if let Some(rest) = found {
            let proxy = rest.split_whitespace().next().unwrap().to_string();
            let api = rest
                .split("API on http://")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .to_string();
            return Running {
                child,
                stdout,
                stderr,
                proxy,
                api,
            };
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "sandgate exited with {status}: {:?}",
                stderr.lock().unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "sandgate did not start: {:?}",
            stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn base_config(dir: &Path) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[api]\nlisten = \"127.0.0.1:0\"\n[tls]\nca_dir = {:?}\n[store]\npath = {:?}\n[secrets]\nmaster_key_file = {:?}\n[policy]\ndir = {:?}\n",
        dir.join("certs").display().to_string(),
        dir.join("data/sandgate.db").display().to_string(),
        dir.join("data/master.key").display().to_string(),
        dir.join("policies").display().to_string(),
    )
}

#[test]
fn serve_on_a_config_file_answers_health_and_metrics_and_writes_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &base_config(dir.path()), &[]);
    let health: serde_json::Value =
        reqwest::blocking_get(&format!("http://{}/healthz", running.api));
    assert_eq!(health["status"], "ok");
    assert!(health["policy"]["generation"].as_u64().unwrap() >= 1);
    // The bundled policies were written because the directory did not exist.
    assert!(dir.path().join("policies/egress.rego").exists());
    use std::os::unix::fs::PermissionsExt;
    for key in ["certs/ca.key", "data/master.key"] {
        let mode = std::fs::metadata(dir.path().join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    assert!(std::fs::read_to_string(dir.path().join("certs/ca.pem"))
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    // An unauthenticated proxy request is refused and shows up in the metrics.
    let status = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-x"])
        .arg(format!("http://{}", running.proxy))
        .arg("http://example.test/")
        .output();
    if let Ok(out) = status {
        assert_eq!(String::from_utf8_lossy(&out.stdout), "407");
    }
    let metrics = reqwest::blocking_text(&format!("http://{}/metrics", running.api));
    assert!(metrics.contains("sandgate_"), "{metrics}");

    // With no [[api.tokens]], a local admin token is generated next to the database, and
    // the CLI run from the same directory uses it without SANDGATE_TOKEN.
    let token_file = dir.path().join("data/api-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let out = Command::new(BIN)
        .args(["sandbox", "list"])
        .current_dir(dir.path())
        .env("SANDGATE_URL", format!("http://{}", running.api))
        .env_remove("SANDGATE_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(listed["sandboxes"].is_array(), "{listed}");
    // Its value never reaches a log line.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let logs = running.stderr.lock().unwrap().join("\n");
    assert!(!logs.contains(token.trim()), "the local token was logged");
    assert!(logs.contains("api-token"), "the token file's path is shown");
}

/// A free loopback port (bound, then released for the process under test).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `serve --listen/--api-listen` move the listeners over the file's addresses, and the CLI
/// finds the API by `--url` with the local token of its directory; a token whose
/// environment variable is unset stops `serve` before the store is created.
#[test]
fn serve_flags_move_the_listeners_and_an_unset_token_env_stops_it_before_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("sandgate.toml");
    std::fs::write(&config_path, base_config(dir.path())).unwrap();
    let (proxy, api) = (free_port(), free_port());
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config_path)
        .args(["--listen", &format!("127.0.0.1:{proxy}")])
        .args(["--api-listen", &format!("127.0.0.1:{api}")])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = capture(child.stderr.take().unwrap());
    let want = format!(
        "sandgate: proxy on http://127.0.0.1:{proxy} (HTTP_PROXY), API on http://127.0.0.1:{api},"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stderr.lock().unwrap().iter().any(|l| l.starts_with(&want)) {
        assert!(Instant::now() < deadline, "{:?}", stderr.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new(BIN)
        .args([
            "sandbox",
            "list",
            "-q",
            "--url",
            &format!("http://127.0.0.1:{api}"),
        ])
        .current_dir(dir.path())
        .env_remove("SANDGATE_URL")
        .env_remove("SANDGATE_TOKEN")
        .env_remove("SANDGATE_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let _ = child.kill();
    let _ = child.wait();

    let other = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[[api.tokens]]\ntoken_env = \"SANDGATE_TEST_UNSET_CLI_TOKEN\"\nprincipal = \"p\"\nworkspace = \"w\"\n",
        base_config(other.path())
    );
    let config_path = other.path().join("sandgate.toml");
    std::fs::write(&config_path, config).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config_path)
        .current_dir(other.path())
        .env_remove("SANDGATE_TEST_UNSET_CLI_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: invalid_config: sandgate could not start: config key `api.tokens[0].token_env`"
        ),
        "{stderr}"
    );
    assert!(
        !other.path().join("data/sandgate.db").exists(),
        "the store was not created"
    );
}

/// `[proxy] workers = 3`: three threads of their own serve the proxy, and connections held
/// open at the same time are all answered (each stays on the worker that accepted it).
#[test]
fn proxy_workers_are_threads_of_their_own_and_all_serve() {
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(dir.path()).replace("[proxy]\n", "[proxy]\nworkers = 3\n");
    let running = serve(dir.path(), &config, &[]);
    let mut names = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", running.child.id())).unwrap() {
        let comm = std::fs::read_to_string(task.unwrap().path().join("comm")).unwrap_or_default();
        names.push(comm.trim().to_string());
    }
    let workers: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("proxy-worker-"))
        .collect();
    assert_eq!(workers.len(), 3, "threads: {names:?}");

    use std::io::{Read, Write};
    let mut held: Vec<std::net::TcpStream> = (0..12)
        .map(|_| std::net::TcpStream::connect(&running.proxy).unwrap())
        .collect();
    for conn in &mut held {
        conn.write_all(b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n")
            .unwrap();
    }
    for conn in &mut held {
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = [0u8; 12];
        conn.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 407", "every held connection is served");
    }
}

#[test]
fn an_unknown_config_key_is_a_startup_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[proxy]\nlistn = \"127.0.0.1:0\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("proxy.listn"), "{stderr}");
}

#[test]
fn ca_init_show_path() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[tls]\nca_dir = {:?}\n",
            dir.path().join("ca").display().to_string()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (ok, _) = run(&["ca", "show"]);
    assert!(!ok, "show before init fails");
    let (ok, text) = run(&["ca", "init"]);
    assert!(ok && text.contains("generated"), "{text}");
    let (ok, text) = run(&["ca", "init"]);
    assert!(ok && text.contains("already present"), "{text}");
    let (ok, path) = run(&["ca", "path"]);
    assert!(ok);
    let (ok, pem) = run(&["ca", "show"]);
    assert!(ok);
    assert_eq!(std::fs::read_to_string(path.trim()).unwrap(), pem);
}

#[test]
fn policy_test_runs_the_bundled_tests_and_fails_a_broken_one() {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let out = Command::new(BIN)
        .args(["policy", "test"])
        .arg(&policies)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&policies).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        dir.path().join("broken_test.rego"),
        "package broken_test\nimport rego.v1\nimport data.sandgate.egress\ntest_everything_allowed if egress.allow with input as {}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["policy", "test"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL: broken_test.test_everything_allowed"),
        "{stdout}"
    );
    assert!(stdout.contains(", 1 failed"), "{stdout}");

    std::fs::write(dir.path().join("syntax.rego"), "package x\nallow if {{{\n").unwrap();
    let out = Command::new(BIN)
        .args(["policy", "check"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("syntax.rego:"));

    // eval prints the decision with its reasons.
    let input = dir.path().join("input.json");
    std::fs::write(
        &input,
        r#"{"phase":"connect","sandbox":{"id":"s","workspace":"w","labels":{},"allow_domains":["a.test"]},
            "destination":{"host":"b.test","port":443,"ip":null,"scheme":"connect","match_names":["b.test","*.test"]}}"#,
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["policy", "eval", "--layer", "egress", "--input"])
        .arg(&input)
        .arg("--dir")
        .arg(&policies)
        .output()
        .unwrap();
    let decision: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decision["allowed"], false);
    assert_eq!(out.status.code(), Some(1));
}

/// Every secret a run handles, through every path: config-file credential injected by
/// header, placeholders resolved and refused, API-created and rotated credentials, a
/// malformed API body carrying a secret. None of them may appear in stdout (the decision
/// log) or stderr (diagnostics at debug level).
#[test]
fn no_secret_reaches_any_log_line() {
    init();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ca = TestCa::new();
    let origin = runtime.block_on(start_origin(Some(
        ca.server_config(&["api.a.test", "api.b.test"]),
    )));
    let dir = tempfile::tempdir().unwrap();
    let file_secret = "file-secret-9c2b7e11";
    let env_secret = "env-secret-41d0aa3f";
    let api_secret = "api-secret-77e1c0de";
    let rotated_secret = "rotated-secret-0b5e";
    let body_secret = "body-secret-5a5a5a5a";
    std::fs::write(dir.path().join("secret"), file_secret).unwrap();
    let port = origin.port();
    let config = base_config(dir.path())
        + &format!(
            r#"[dns.hosts]
"api.a.test" = "127.0.0.1"
"api.b.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.0/8"]
[[egress.identities]]
id = "sb-a"
token = "{TOKEN}"
workspace = "ws-a"
allow_domains = ["api.a.test", "api.b.test"]
credentials = ["file", "env"]
[[api.tokens]]
token_env = "TEST_API_TOKEN"
principal = "alice"
workspace = "ws-a"
[[credentials]]
workspace = "ws-a"
name = "file"
secret_file = {file:?}
destinations = [{{ host = "api.a.test", ports = [{port}] }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}
[[credentials]]
workspace = "ws-a"
name = "env"
secret_env = "TEST_ENV_SECRET"
destinations = [{{ host = "api.a.test", ports = [{port}], path_prefix = "/basic/" }}]
apply = {{ type = "basic", username = "bot" }}
"#,
            file = dir.path().join("secret").display().to_string()
        );
    // upstream trust for the test origin
    let config = config.replace(
        "[store]",
        &format!(
            "upstream_ca_files = [{:?}]\n[store]",
            ca.pem_path.display().to_string()
        ),
    );
    let api_token = "api-token-for-log-test-123";
    let running = serve(
        dir.path(),
        &config,
        &[
            ("TEST_ENV_SECRET", env_secret),
            ("TEST_API_TOKEN", api_token),
        ],
    );
    let sandgate_ca = std::fs::read(dir.path().join("certs/ca.pem")).unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(format!("http://sb-a:{TOKEN}@{}", running.proxy)).unwrap())
            .tls_certs_only([reqwest::Certificate::from_pem(&sandgate_ca).unwrap()])
            .build()
            .unwrap();
        let api = reqwest::Client::new();
        let env: serde_json::Value = api
            .get(format!("http://{}/v1/identities/sb-a/env", running.api))
            .bearer_auth(api_token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let placeholder = env["placeholders"]["file"].as_str().unwrap().to_string();
        let a = format!("https://api.a.test:{port}");
        let b = format!("https://api.b.test:{port}");
        let first = client.get(format!("{a}/x")).send().await.unwrap();
        assert_eq!(first.status(), 200, "{:?}", first.text().await);
        let basic = client.get(format!("{a}/basic/b")).send().await.unwrap();
        assert_eq!(basic.status(), 200);
        // Out of its declared slot (the query instead of `authorization`): refused.
        assert_eq!(
            client
                .get(format!("{a}/y?k={placeholder}"))
                .send()
                .await
                .unwrap()
                .status(),
            403
        );
        assert_eq!(
            client
                .get(format!("{b}/z"))
                .header("authorization", format!("Bearer {placeholder}"))
                .send()
                .await
                .unwrap()
                .status(),
            403
        );
        let base = format!("http://{}/v1/workspaces/ws-a/credentials", running.api);
        let created = api
            .post(&base)
            .bearer_auth(api_token)
            .json(&serde_json::json!({"name": "api", "secret": api_secret,
                "destinations": [{"host": "api.b.test", "ports": [port]}],
                "apply": {"type": "query", "param": "key"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        let rotated = api
            .put(format!("{base}/api"))
            .bearer_auth(api_token)
            .json(&serde_json::json!({"secret": rotated_secret,
                "destinations": [{"host": "api.b.test", "ports": [port]}],
                "apply": {"type": "query", "param": "key"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(rotated.status(), 200);
        let bad = api
            .post(&base)
            .bearer_auth(api_token)
            .header("content-type", "application/json")
            .body(format!(r#"{{"name": 5, "secret": "{body_secret}"}}"#))
            .send()
            .await
            .unwrap();
        assert_eq!(bad.status(), 400);
        assert!(!bad.text().await.unwrap().contains(body_secret));
        // The origin did receive the real secrets: they were used, just never logged.
        let seen = origin.seen.lock().unwrap().clone();
        assert!(seen
            .iter()
            .any(|s| s.headers.values().any(|v| v.contains(file_secret))));
        assert!(!seen.iter().any(|s| s.path.contains(file_secret)));
    });
    std::thread::sleep(Duration::from_millis(300));
    let stdout = running.stdout.lock().unwrap().clone();
    let stderr = running.stderr.lock().unwrap().clone();
    assert!(
        stdout.len() >= 3,
        "decision records were written: {stdout:?}"
    );
    assert!(
        stdout
            .iter()
            .any(|l| l.contains("\"credentials\":[\"file\",\"env\"]")),
        "{stdout:?}"
    );
    // Diagnostics carry the sandbox, workspace and request id of the request they are about.
    assert!(
        stderr.iter().any(|l| l.contains("egress decision")
            && l.contains("sandbox=sb-a")
            && l.contains("workspace=ws-a")
            && l.contains("request_id=")),
        "{stderr:?}"
    );
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("bot:{env_secret}"));
    for secret in [
        file_secret,
        env_secret,
        api_secret,
        rotated_secret,
        body_secret,
        api_token,
        TOKEN,
        basic.as_str(),
    ] {
        for line in stdout.iter().chain(stderr.iter()) {
            assert!(
                !line.contains(secret),
                "a log line contains a secret: {line}"
            );
        }
    }
}

mod reqwest {
    pub use ::reqwest::*;

    pub fn blocking_get(url: &str) -> serde_json::Value {
        super::init();
        let url = url.to_string();
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move { ::reqwest::get(url).await.unwrap().json().await.unwrap() })
    }

    pub fn blocking_text(url: &str) -> String {
        super::init();
        let url = url.to_string();
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move { ::reqwest::get(url).await.unwrap().text().await.unwrap() })
    }
}

#[test]
fn demo_shows_injection_refusal_and_no_route_then_cleans_up() {
    if !root_or_skip("cli::demo") {
        return;
    }
    let out = Command::new(BIN)
        .arg("demo")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("DEMO_TOKEN=sgph_"), "{stdout}");
    assert!(
        stdout.contains("=> the secret was injected outside the sandbox"),
        "{stdout}"
    );
    // The refusal is answered inside the tunnel (the default deny_mode): curl prints the
    // JSON reason for the HTTPS request as for the plain one.
    let step6 = stdout
        .split("== 6.")
        .nth(1)
        .and_then(|rest| rest.split("== 7.").next())
        .unwrap_or_else(|| panic!("no step 6: {stdout}"));
    assert_eq!(
        step6.matches("\"code\":\"egress_denied\"").count(),
        2,
        "{step6}"
    );
    assert!(
        step6.contains("\"reason\":\"sandgate's egress policy refuses blocked.demo.test"),
        "{step6}"
    );
    assert!(step6.contains("}}exit 0"), "{step6}");
    assert!(stdout.contains("-> 200 OK"), "{stdout}");
    let instance = stdout
        .split("(instance ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("the demo names its instance");
    assert!(instance.starts_with("lb-"), "{instance}");
    assert!(
        !Path::new("/run/netns")
            .join(format!("sg-{instance}"))
            .exists(),
        "the demo left its network namespace"
    );
}

#[test]
fn sandbox_exec_streams_output_and_exits_with_the_commands_code() {
    if !root_or_skip("cli::sandbox_exec") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = "cli-exec-token-0123456789";
    // `on_shutdown = "stop"`: the end checks that a graceful stop removes a running sandbox
    // (the default, "keep", is `local_restart`'s).
    let config = format!(
        "{}[[api.tokens]]\ntoken = {token:?}\nprincipal = \"cli\"\nworkspace = \"ws\"\n\
         [local]\non_shutdown = \"stop\"\n",
        base_config(dir.path())
    );
    let running = serve(dir.path(), &config, &[]);
    let cli = |args: &[&str], stdin: Option<&[u8]>| {
        let mut child = Command::new(BIN)
            .args(args)
            .env("SANDGATE_URL", format!("http://{}", running.api))
            .env("SANDGATE_TOKEN", token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(input).unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    };
    let created = cli(&["sandbox", "create"], None);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stdout)
    );
    let sandbox: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    let id = sandbox["id"].as_str().unwrap();

    let out = cli(
        &[
            "sandbox",
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "echo hi; echo oops >&2; exit 3",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");

    // Binary files round-trip through the CLI.
    let payload: Vec<u8> = (0..=255u8).collect();
    let out = cli(
        &["sandbox", "files", "write", id, "/home/user/b.bin"],
        Some(&payload),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = cli(&["sandbox", "files", "read", id, "/home/user/b.bin"], None);
    assert_eq!(out.stdout, payload);

    // files ls: ls's mode column, the size, the name; -q the names only.
    let out = cli(
        &["sandbox", "files", "ls", id, "/home/user", "-o", "table"],
        None,
    );
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["MODE", "SIZE", "MODIFIED", "NAME"], "{table}");
    let row = lines
        .iter()
        .find(|r| r.last() == Some(&"b.bin"))
        .expect(&table);
    assert_eq!((row[0], row[1]), ("-rw-r--r--", "256"), "{table}");
    assert!(!table.contains('\u{1b}'));
    let out = cli(&["sandbox", "files", "ls", id, "/home/user", "-q"], None);
    assert!(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l == "b.bin"));
    // A missing file: exit 3, the error on stderr, nothing on stdout.
    let out = cli(&["sandbox", "files", "read", id, "/home/user/none"], None);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: not_found: "));

    // An API refusal is exit 125 with the error on stderr in the CLI's shape.
    let out = cli(&["sandbox", "exec", "sb-nope", "--", "true"], None);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: not_found: "));

    let out = cli(&["sandbox", "pause", id], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = cli(&["sandbox", "resume", id], None);
    assert!(out.status.success());
    let out = cli(&["sandbox", "delete", id], None);
    assert!(out.status.success());

    // With on_shutdown = "stop", a sandbox still running when the gateway stops (SIGTERM) is
    // removed with it.
    let created = cli(&["sandbox", "create"], None);
    let sandbox: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    let instance = sandbox["placement"]["instance_id"].as_str().unwrap();
    let netns = Path::new("/run/netns").join(format!("sg-{instance}"));
    let sandbox_dir = dir.path().join("data/sandboxes").join(instance);
    assert!(netns.exists() && sandbox_dir.exists());
    let mut running = running;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(running.child.id() as libc::pid_t, libc::SIGTERM) };
    let status = running.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        !netns.exists(),
        "its network namespace outlived the gateway"
    );
    assert!(!sandbox_dir.exists(), "its directory outlived the gateway");
}

/// The argv of each exec run in a new local sandbox of a `serve` (with `log` as its `[log]`
/// table, diagnostics at `trace`), and everything it logged: the decision log file, stdout
/// and stderr lines, and the action layer's decision records.
struct ExecLogs {
    lines: Vec<String>,
    actions: Vec<serde_json::Value>,
}

fn exec_and_collect_logs(log: &str, argvs: &[Vec<String>]) -> ExecLogs {
    let dir = tempfile::tempdir().unwrap();
    let token = "cli-argv-token-0123456789";
    let decisions = dir.path().join("decisions.jsonl");
    let config = format!(
        "{}[[api.tokens]]\ntoken = {token:?}\nprincipal = \"cli\"\nworkspace = \"ws\"\n[log]\ndecisions = {:?}\n{log}\n",
        base_config(dir.path()),
        decisions.display().to_string(),
    );
    let running = serve(dir.path(), &config, &[("RUST_LOG", "trace")]);
    init();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let api = reqwest::Client::new();
        let base = format!("http://{}/v1/sandboxes", running.api);
        let resp = api
            .post(&base)
            .bearer_auth(token)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let created: serde_json::Value = resp.json().await.unwrap();
        let id = created["id"].as_str().unwrap().to_string();
        for argv in argvs {
            let resp = api
                .post(format!("{base}/{id}/exec"))
                .bearer_auth(token)
                .json(&serde_json::json!({"argv": argv, "timeout_ms": 30000}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let text = resp.text().await.unwrap();
            assert!(text.contains("\"type\":\"exit\""), "{argv:?}: {text}");
        }
        let resp = api
            .delete(format!("{base}/{id}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    });
    let mut decision_lines = Vec::new();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        decision_lines = std::fs::read_to_string(&decisions)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        let execs = decision_lines
            .iter()
            .filter(|l| l.contains("\"operation\":\"exec\""))
            .count();
        if execs >= argvs.len() {
            break;
        }
    }
    let actions: Vec<serde_json::Value> = decision_lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "policy" && r["layer"] == "action")
        .collect();
    assert_eq!(actions.len(), argvs.len(), "{decision_lines:#?}");
    let mut lines = decision_lines;
    lines.extend(running.stdout.lock().unwrap().iter().cloned());
    let stderr = running.stderr.lock().unwrap().clone();
    assert!(
        stderr.iter().any(|l| l.contains("exec started")),
        "diagnostics were captured: {stderr:#?}"
    );
    lines.extend(stderr);
    ExecLogs { lines, actions }
}

/// SHA-256 of each argument's length (8 bytes, big-endian) and bytes, in order, in hex.
fn argv_sha256(argv: &[String]) -> String {
    let mut framed = Vec::new();
    for arg in argv {
        framed.extend_from_slice(&(arg.len() as u64).to_be_bytes());
        framed.extend_from_slice(arg.as_bytes());
    }
    ring::digest::digest(&ring::digest::SHA256, &framed)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn strings(argv: &[&str]) -> Vec<String> {
    argv.iter().map(|a| a.to_string()).collect()
}

#[test]
fn exec_argv_reaches_no_log_line() {
    if !root_or_skip("cli::exec_argv_reaches_no_log_line") {
        return;
    }
    let password = "s3cretpass-argv-7f1e2d";
    let other = "argv-secret-c0ffee-9911";
    let userinfo = format!("user:{password}");
    let argvs = vec![
        strings(&["curl", "-s", "-u", &userinfo, "http://127.0.0.1:1/"]),
        strings(&["sh", "-c", "test -n \"$1\"", "sh", other]),
    ];
    let logs = exec_and_collect_logs("", &argvs);
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(&userinfo);
    for secret in [password, other, basic.as_str()] {
        for line in &logs.lines {
            assert!(!line.contains(secret), "a log line holds {secret}: {line}");
        }
    }
    // What is logged instead: the program, the count, and a hash that identifies the argv.
    for (record, argv) in logs.actions.iter().zip(&argvs) {
        let exec = &record["input"]["exec"];
        assert!(exec.get("argv").is_none(), "{record}");
        assert_eq!(exec["argv0"], argv[0].as_str(), "{record}");
        assert_eq!(exec["argc"], argv.len(), "{record}");
        assert_eq!(exec["argv_sha256"], argv_sha256(argv), "{record}");
        assert_eq!(record["decision"], "allow", "{record}");
    }
}

#[test]
fn full_argv_logs_the_whole_argv_when_asked() {
    if !root_or_skip("cli::full_argv_logs_the_whole_argv_when_asked") {
        return;
    }
    let argv = strings(&["sh", "-c", "test -n \"$1\"", "sh", "argv-logged-on-purpose"]);
    let logs = exec_and_collect_logs("full_argv = true", std::slice::from_ref(&argv));
    let exec = &logs.actions[0]["input"]["exec"];
    assert_eq!(exec["argv"], serde_json::json!(argv), "{exec}");
    // Diagnostics still never print it.
    let stderr_hits = logs
        .lines
        .iter()
        .filter(|l| l.contains("argv-logged-on-purpose"))
        .count();
    assert_eq!(stderr_hits, 1, "only the one decision record holds it");
}
