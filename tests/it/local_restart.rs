//! Local sandboxes survive a gateway restart (issue 31): the real `sandgate` binary is killed
//! with SIGKILL, and later stopped with SIGTERM (`[local] on_shutdown = "keep"`, the default),
//! while three sandboxes run a background command and hold files; after each restart the same
//! ids are `running` on the same instances, the files are intact, the command still runs (the
//! same process), and egress through each sandbox's own proxy listener works as that sandbox
//! (its credential injected, the decision log naming it). One sandbox is broken on purpose
//! while no gateway runs (its init killed, then its network namespace deleted): it comes back
//! `failed` with the reason, and nothing of it is left on the machine. A paused sandbox comes
//! back paused and a stopped one stopped (both resume with their files). Deleting the
//! re-adopted sandboxes leaves nothing behind either; a re-adopted instance no sandbox claims
//! is deleted at start, and one whose proxy port was taken meanwhile is failed. With `on_shutdown = "stop"` a graceful stop deletes
//! the sandboxes.
//!
//! Needs root (namespaces, cgroups): `root_or_skip` decides.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN: &str = "api-token-local-restart-0123456789";
const SECRET: &str = "ghp_local_restart_real_secret_9191";

/// One test's world: its directory, origin and the prefix of its namespaces.
struct World {
    dir: tempfile::TempDir,
    origin: Origin,
    _ca: TestCa,
    prefix: &'static str,
    http: reqwest::Client,
}

impl Drop for World {
    /// Whatever a failing test left running is removed (kept sandboxes outlive the gateway
    /// by design).
    fn drop(&mut self) {
        for pid in processes_rooted_in(self.dir.path()) {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        for ns in netns_with_prefix(self.prefix) {
            let _ = Command::new("ip").args(["netns", "delete", &ns]).status();
        }
    }
}

async fn world(test: &str, prefix: &'static str) -> Option<World> {
    if !root_or_skip(&format!("local_restart::{test}")) {
        return None;
    }
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.allowed.test"]))).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gh"), SECRET).unwrap();
    Some(World {
        dir,
        origin,
        _ca: ca,
        prefix,
        http: reqwest::Client::new(),
    })
}

impl World {
    fn write_config(&self, on_shutdown: &str) {
        let dir = self.dir.path();
        let extra = format!(
            r#"netns_prefix = "{prefix}"
cgroup = "sandgate-{prefix}test"
on_shutdown = "{on_shutdown}"
[[api.tokens]]
token = "{TOKEN}"
principal = "alice"
workspace = "ws-a"
[[credentials]]
workspace = "ws-a"
name = "gh"
secret_file = {secret:?}
placeholder_env = "GH_TOKEN"
destinations = [{{ host = "api.allowed.test", ports = [{port}] }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}
[dns.hosts]
"api.allowed.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.0/8"]
"#,
            prefix = self.prefix,
            secret = dir.join("gh").display().to_string(),
            port = self.origin.port(),
        );
        let config = process_config(dir, "", "", &extra).replacen(
            "[tls]\n",
            &format!(
                "[tls]\nupstream_ca_files = [{:?}]\n",
                self._ca.pem_path.display().to_string()
            ),
            1,
        );
        std::fs::write(dir.join("sandgate.toml"), config).unwrap();
    }

    fn serve(&self) -> Served {
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--config"])
            .arg(self.dir.path().join("sandgate.toml"))
            .current_dir(self.dir.path())
            .env("RUST_LOG", "info");
        serve_process(command)
    }

    fn instance_dir(&self, instance: &str) -> PathBuf {
        self.dir.path().join("local/sandboxes").join(instance)
    }

    async fn call(&self, gw: &Served, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("http://{}{path}", gw.api);
        let mut request = self
            .http
            .request(method.parse().unwrap(), url)
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn create(&self, gw: &Served) -> (String, String) {
        let body =
            json!({"credentials": ["gh"], "network": {"allow_domains": ["api.allowed.test"]}});
        let sandbox = self.call(gw, "POST", "/v1/sandboxes", Some(body)).await;
        assert_eq!(sandbox["state"], "running", "{sandbox:#}");
        let instance = sandbox["placement"]["instance_id"].as_str().unwrap();
        (
            sandbox["id"].as_str().unwrap().to_string(),
            instance.to_string(),
        )
    }

    async fn get(&self, gw: &Served, id: &str) -> Value {
        self.call(gw, "GET", &format!("/v1/sandboxes/{id}"), None)
            .await
    }

    /// Runs a shell script in the sandbox: (stdout, exit code).
    async fn sh(&self, gw: &Served, id: &str, script: &str) -> (String, i64) {
        let url = format!("http://{}/v1/sandboxes/{id}/exec", gw.api);
        let response = self
            .http
            .post(url)
            .bearer_auth(TOKEN)
            .json(&json!({"argv": ["sh", "-c", script], "timeout_ms": 30000}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "{text}");
        let (mut out, mut code) = (String::new(), -1);
        for event in text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        {
            match event["type"].as_str() {
                Some("stdout") => out.push_str(event["text"].as_str().unwrap_or_default()),
                Some("exit") => code = event["code"].as_i64().unwrap_or(-1),
                _ => {}
            }
        }
        (out, code)
    }

    /// Files, a background command that keeps ticking, its pid recorded.
    async fn populate(&self, gw: &Served, id: &str) {
        let script = format!(
            "printf '%s' 'data of {id}' > /home/user/data.txt && \
             (while :; do date +%s%N >> /tmp/ticks; sleep 0.2; done) >/dev/null 2>&1 </dev/null & \
             echo $! > /home/user/ticker.pid"
        );
        let (_, code) = self.sh(gw, id, &script).await;
        assert_eq!(code, 0);
    }

    /// The sandbox is as it was: its files, the same background process still ticking, its
    /// proxy listener serving it as itself.
    async fn assert_intact(&self, gw: &Served, id: &str, instance: &str) {
        let sandbox = self.get(gw, id).await;
        assert_eq!(sandbox["state"], "running", "{sandbox:#}");
        assert_eq!(sandbox["placement"]["instance_id"], instance, "{sandbox:#}");
        let (out, code) = self.sh(gw, id, "cat /home/user/data.txt").await;
        assert_eq!((out.as_str(), code), (format!("data of {id}").as_str(), 0));
        let script = "kill -0 $(cat /home/user/ticker.pid) && a=$(wc -l < /tmp/ticks) && \
                      sleep 1 && b=$(wc -l < /tmp/ticks) && [ $b -gt $a ] && echo ticking";
        let (out, code) = self.sh(gw, id, script).await;
        assert_eq!(
            (out.trim(), code),
            ("ticking", 0),
            "the background command stopped"
        );
        self.assert_egress(gw, id).await;
    }

    async fn assert_egress(&self, gw: &Served, id: &str) {
        let path = format!("/from-{id}");
        let script = format!(
            "curl -sS -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $GH_TOKEN\" \
             https://api.allowed.test:{}{path}",
            self.origin.port()
        );
        let (out, code) = self.sh(gw, id, &script).await;
        assert_eq!((out.as_str(), code), ("200", 0), "egress of {id}");
        let seen = self.origin.last().unwrap();
        assert_eq!(seen.path, path);
        assert!(seen
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == &format!("Bearer {SECRET}")));
        // The decision log names the sandbox: the listener served it as itself.
        let log = self.dir.path().join("decisions.jsonl");
        let named = wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    serde_json::from_str::<Value>(l)
                        .is_ok_and(|r| r["sandbox"] == id && r["path"] == path.as_str())
                })
        });
        assert!(named, "no decision names {id} for {path}");
    }

    /// The sandbox is `failed` with the stable code, and nothing of its instance is left.
    async fn assert_failed(&self, gw: &Served, id: &str, instance: &str, code: &str) {
        let sandbox = self.get(gw, id).await;
        assert_eq!(sandbox["state"], "failed", "{sandbox:#}");
        // The stored error body, as every failed sandbox shows it.
        let error = &sandbox["error"]["error"];
        assert_eq!(error["code"], "instance_lost", "{sandbox:#}");
        assert_eq!(error["details"]["provider_state"], code, "{sandbox:#}");
        assert_eq!(error["details"]["instance_id"], instance, "{sandbox:#}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("could not be taken over"),
            "{error:#}"
        );
        let events = self
            .http
            .get(format!("http://{}/v1/sandboxes/{id}/events", gw.api))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(events.contains("event: done"), "{events}");
        assert!(events.contains(code), "the events do not say why: {events}");
        self.assert_gone(instance);
    }

    fn assert_gone(&self, instance: &str) {
        let ns = format!("{}{instance}", self.prefix);
        assert!(!Path::new("/run/netns").join(&ns).exists(), "{ns} is left");
        let dir = self.instance_dir(instance);
        assert!(!dir.exists(), "{} is left", dir.display());
        assert!(
            processes_rooted_in(&dir).is_empty(),
            "processes of {instance} are left"
        );
        let group = cgroup_named(Path::new("/sys/fs/cgroup"), instance, 0);
        assert!(group.is_none(), "cgroup {group:?} is left");
    }

    fn init_pid(&self, instance: &str) -> u32 {
        let life: Value = serde_json::from_slice(
            &std::fs::read(self.instance_dir(instance).join("life.json")).unwrap(),
        )
        .unwrap();
        life["init"]["pid1"]["pid"].as_u64().unwrap() as u32
    }
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// A cgroup directory named `name` anywhere under `dir` (any hierarchy).
fn cgroup_named(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    if depth > 10 {
        return None;
    }
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == name {
            return Some(entry.path());
        }
        if let Some(found) = cgroup_named(&entry.path(), name, depth + 1) {
            return Some(found);
        }
    }
    None
}

fn netns_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Host pids whose root directory is inside `dir`.
fn processes_rooted_in(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(root) = std::fs::read_link(format!("/proc/{pid}/root")) {
            if root.starts_with(dir) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// SIGTERM, then waits for the exit (a graceful stop).
fn terminate(mut gw: Served) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    let sent = unsafe { libc::kill(gw.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let stopped = wait_for(Duration::from_secs(30), || {
        matches!(gw.child.try_wait(), Ok(Some(_)))
    });
    assert!(stopped, "sandgate did not stop on SIGTERM");
}

fn kill_9(mut gw: Served) {
    gw.child.kill().unwrap();
    gw.child.wait().unwrap();
}

#[tokio::test]
async fn sandboxes_survive_sigkill_and_sigterm_and_a_broken_one_fails_with_its_reason() {
    let Some(w) = world("survive", "sgr-").await else {
        return;
    };
    w.write_config("keep");
    let gw = w.serve();
    let mut kept = Vec::new();
    for _ in 0..3 {
        let (id, instance) = w.create(&gw).await;
        w.populate(&gw, &id).await;
        kept.push((id, instance));
    }
    let (broken, broken_instance) = w.create(&gw).await;
    // A paused one stays paused (frozen) across the restart.
    let (paused, paused_instance) = w.create(&gw).await;
    w.populate(&gw, &paused).await;
    w.call(&gw, "POST", &format!("/v1/sandboxes/{paused}/pause"), None)
        .await;

    // SIGKILL; meanwhile the fourth sandbox's init dies (and its whole PID namespace).
    kill_9(gw);
    let init = w.init_pid(&broken_instance);
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(init as libc::pid_t, libc::SIGKILL) };
    assert!(wait_for(Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{init}")).exists()
    }));
    let gw = w.serve();
    for (id, instance) in &kept {
        w.assert_intact(&gw, id, instance).await;
    }
    w.assert_failed(&gw, &broken, &broken_instance, "init_gone")
        .await;
    assert_eq!(w.get(&gw, &paused).await["state"], "paused");
    w.call(&gw, "POST", &format!("/v1/sandboxes/{paused}/resume"), None)
        .await;
    w.assert_intact(&gw, &paused, &paused_instance).await;
    kept.push((paused, paused_instance));

    // A sandbox the restarted gateway made, broken while the gateway is down: its
    // namespace is deleted. SIGTERM leaves the others running (on_shutdown = "keep").
    let (broken, broken_instance) = w.create(&gw).await;
    // A stopped one stays stopped, its files kept, and starts again.
    let (stopped, stopped_instance) = w.create(&gw).await;
    w.populate(&gw, &stopped).await;
    w.call(&gw, "POST", &format!("/v1/sandboxes/{stopped}/stop"), None)
        .await;
    terminate(gw);
    let ns = format!("sgr-{broken_instance}");
    assert!(Command::new("ip")
        .args(["netns", "delete", &ns])
        .status()
        .unwrap()
        .success());
    let gw = w.serve();
    for (id, instance) in &kept {
        w.assert_intact(&gw, id, instance).await;
    }
    w.assert_failed(&gw, &broken, &broken_instance, "netns_gone")
        .await;
    assert_eq!(w.get(&gw, &stopped).await["state"], "stopped");
    w.call(&gw, "POST", &format!("/v1/sandboxes/{stopped}/start"), None)
        .await;
    let (out, _) = w.sh(&gw, &stopped, "cat /home/user/data.txt").await;
    assert_eq!(out, format!("data of {stopped}"));
    w.assert_egress(&gw, &stopped).await;
    w.call(&gw, "DELETE", &format!("/v1/sandboxes/{stopped}"), None)
        .await;
    w.assert_gone(&stopped_instance);

    // Deleting re-adopted sandboxes leaves nothing behind.
    for (id, instance) in &kept {
        w.call(&gw, "DELETE", &format!("/v1/sandboxes/{id}"), None)
            .await;
        w.assert_gone(instance);
    }
    terminate(gw);
    assert!(netns_with_prefix("sgr-").is_empty());
}

#[tokio::test]
async fn on_shutdown_stop_deletes_the_sandboxes_at_a_graceful_stop() {
    let Some(w) = world("stop", "sgs-").await else {
        return;
    };
    w.write_config("stop");
    let gw = w.serve();
    let (id, instance) = w.create(&gw).await;
    w.populate(&gw, &id).await;
    terminate(gw);
    w.assert_gone(&instance);
    let gw = w.serve();
    let sandbox = w.get(&gw, &id).await;
    assert_eq!(sandbox["state"], "failed", "{sandbox:#}");
    assert_eq!(
        sandbox["error"]["error"]["code"], "instance_lost",
        "{sandbox:#}"
    );
    assert!(
        sandbox["error"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("on_shutdown"),
        "{sandbox:#}"
    );
    terminate(gw);
}

#[tokio::test]
async fn a_sandbox_that_takes_its_proxy_port_while_no_gateway_runs_is_failed_not_served() {
    let Some(w) = world("squat", "sgq-").await else {
        return;
    };
    if !Path::new("/usr/bin/python3").exists() {
        // The squatter needs something that can listen; the sandbox sees the host's /usr.
        eprintln!("python3 not installed: local_restart::squat skipped");
        return;
    }
    w.write_config("keep");
    let gw = w.serve();
    let (id, instance) = w.create(&gw).await;
    // Tries to listen on the proxy port until it can: as soon as no gateway holds it.
    let squat = "(while :; do python3 -c 'import socket,time\n\
                 s=socket.socket(); s.bind((\"127.0.0.1\", 3128)); s.listen(); time.sleep(3600)' \
                 2>/dev/null; sleep 0.1; done) >/dev/null 2>&1 </dev/null &";
    let (_, code) = w.sh(&gw, &id, squat).await;
    assert_eq!(code, 0);
    kill_9(gw);
    // Once the squatter listens inside the sandbox, the port is its.
    let ns = format!("sgq-{instance}");
    let taken = wait_for(Duration::from_secs(10), || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "ss", "-Hltn", "sport = :3128"])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
    });
    assert!(taken, "the squatter did not get the port");
    let gw = w.serve();
    w.assert_failed(&gw, &id, &instance, "proxy_port_taken")
        .await;
    terminate(gw);
}

#[tokio::test]
async fn a_re_adopted_instance_no_sandbox_claims_is_deleted() {
    let Some(w) = world("unclaimed", "sgu-").await else {
        return;
    };
    w.write_config("keep");
    let gw = w.serve();
    let (id, instance) = w.create(&gw).await;
    w.populate(&gw, &id).await;
    kill_9(gw);
    // The record moved on while the instance stayed (a delete cut short by the crash).
    let store = sandgate::store::Store::open_sqlite(&w.dir.path().join("data/sandgate.db"))
        .await
        .unwrap();
    let now = sandgate::base::clock::now_ms();
    let moved = store
        .transition_sandbox(&id, &["running"], "deleted", None, None, now)
        .await
        .unwrap();
    assert!(moved);
    drop(store);
    assert!(w.instance_dir(&instance).join("state.json").exists());
    let gw = w.serve();
    w.assert_gone(&instance);
    let said = gw.stderr.lock().unwrap().iter().any(|l| {
        l.contains("deleted a re-adopted instance no sandbox claims") && l.contains(&instance)
    });
    assert!(said, "the start-up log does not say it");
    terminate(gw);
}
