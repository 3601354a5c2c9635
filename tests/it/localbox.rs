//! End-to-end tests of the local sandbox runtime (`sandgate::localbox`).
//!
//! They create real namespaces, mounts and cgroups, so they need root: [`runtime`] checks
//! that once and every test prints a skip message and returns when it is not available.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;

use crate::common::{root_or_skip, skip_verdict, which};
use sandgate::localbox::{
    CgroupMode, EntryKind, ExecEvent, ExecRequest, ExitReason, Limits, LocalRuntime, LocalboxError,
    RuntimeConfig, SandboxSpec, SandboxStatus, CA_ENV_VARS,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

const PROXY: &str = "http://sb-user:s3cret-token@127.0.0.1:3128";
const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n";
const STUB_BODY: &str = "hello from the gateway";

/// A runtime over a fresh base directory, or `None` (with a skip message) without root.
pub(crate) fn runtime(
    test: &str,
    extra: Vec<PathBuf>,
) -> Option<(Arc<LocalRuntime>, tempfile::TempDir)> {
    runtime_with(test, extra, CgroupMode::Auto)
}

fn runtime_with(
    test: &str,
    extra: Vec<PathBuf>,
    cgroups: CgroupMode,
) -> Option<(Arc<LocalRuntime>, tempfile::TempDir)> {
    runtime_tuned(test, |config| {
        config.cgroups = cgroups;
        config.extra_ro_binds = extra;
    })
}

/// [`runtime`] with settings of the test's own (`tune` changes the defaults).
pub(crate) fn runtime_tuned(
    test: &str,
    tune: impl FnOnce(&mut RuntimeConfig),
) -> Option<(Arc<LocalRuntime>, tempfile::TempDir)> {
    if !root_or_skip(&format!("localbox::{test}")) {
        return None;
    }
    sweep_stale();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = RuntimeConfig::new(dir.path().join("sandboxes"));
    config.netns_prefix = NETNS_PREFIX.into();
    config.cgroup_name = CGROUP.into();
    tune(&mut config);
    let runtime = LocalRuntime::new(config).expect("local runtime");
    Some((Arc::new(runtime), dir))
}

const NETNS_PREFIX: &str = "sgt-";
const CGROUP: &str = "sandgate-test";

/// Removes what an earlier, crashed run of these tests left: every sandbox id ends in the
/// test process's pid, so namespaces and cgroups of dead processes are safe to remove.
fn sweep_stale() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let dead = |name: &str| {
            name.rsplit('-')
                .next()
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        };
        for entry in std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(NETNS_PREFIX) && dead(&name) {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "delete", &name])
                    .status();
            }
        }
        for root in cgroup_roots() {
            for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if entry.path().is_dir() && dead(&name) {
                    for child in std::fs::read_dir(entry.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                    {
                        if child.path().is_dir() {
                            let _ = std::fs::remove_dir(child.path());
                        }
                    }
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
    });
}

/// `<mount>/<own path>/sandgate-test` of each v1 controller the runtime uses.
fn cgroup_roots() -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    v1_groups(&own)
        .into_iter()
        .map(|p| p.join(CGROUP))
        .filter(|p| p.is_dir())
        .collect()
}

/// Host directories of the freezer, memory, cpu (v1) and unified (v2) groups named in a
/// `/proc/*/cgroup`.
fn v1_groups(proc_cgroup: &str) -> Vec<PathBuf> {
    proc_cgroup
        .lines()
        .filter_map(|line| {
            if let Some(path) = line.strip_prefix("0::") {
                let unified = Path::new("/sys/fs/cgroup/unified");
                let mount = if unified.is_dir() {
                    unified
                } else {
                    Path::new("/sys/fs/cgroup")
                };
                return Some(mount.join(path.trim().trim_start_matches('/')));
            }
            let mut parts = line.splitn(3, ':');
            let _ = parts.next();
            let controllers = parts.next()?;
            let path = parts.next()?;
            let controller = ["freezer", "memory", "cpu"]
                .into_iter()
                .find(|c| controllers.split(',').any(|x| x == *c))?;
            let mount = Path::new("/sys/fs/cgroup").join(controllers);
            let mount = if mount.is_dir() {
                mount
            } else {
                Path::new("/sys/fs/cgroup").join(controller)
            };
            Some(mount.join(path.trim_start_matches('/')))
        })
        .collect()
}

pub(crate) fn id(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

pub(crate) fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        id: id.to_string(),
        proxy_url: PROXY.to_string(),
        ca_pem: Some(CA.as_bytes().to_vec()),
        env: BTreeMap::from([("API_TOKEN".to_string(), "sg-placeholder-123".to_string())]),
        ..SandboxSpec::default()
    }
}

/// A tiny HTTP server on the sandbox's listener: answers every request with
/// [`STUB_BODY`] and reports each request head.
fn serve_stub(listener: tokio::net::TcpListener) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{STUB_BODY}",
                    STUB_BODY.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    rx
}

pub(crate) async fn run(
    rt: &LocalRuntime,
    id: &str,
    argv: &[&str],
) -> sandgate::localbox::ExecOutput {
    let mut request = ExecRequest::new(argv.iter().copied());
    request.timeout = Some(Duration::from_secs(60));
    rt.exec(id, request).await.expect("exec").collect().await
}

async fn sh(rt: &LocalRuntime, id: &str, script: &str) -> sandgate::localbox::ExecOutput {
    run(rt, id, &["sh", "-c", script]).await
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
async fn eventually<F: FnMut() -> bool>(limit: Duration, mut check: F) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_is_inside_the_namespace_and_nothing_else_is_reachable() {
    let Some((rt, _dir)) = runtime("listener", vec![]) else {
        return;
    };
    let id = id("net");
    let created = rt.create(spec(&id)).await.expect("create");
    assert_eq!(created.proxy_port, 3128);
    let mut heads = serve_stub(created.listener);

    // A server on the host's own loopback, which the sandbox must not reach.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    host.set_nonblocking(true).unwrap();

    // Direct to the in-namespace listener (loopback is in NO_PROXY).
    let out = run(
        &rt,
        &id,
        &["curl", "-sS", "-m", "10", "http://127.0.0.1:3128/direct"],
    )
    .await;
    assert_eq!(out.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), STUB_BODY);
    let head = heads.recv().await.unwrap();
    assert!(head.starts_with("GET /direct HTTP/1.1"), "{head}");

    // Through HTTP_PROXY: the absolute-form request and the proxy credentials arrive.
    let out = run(
        &rt,
        &id,
        &[
            "curl",
            "-sS",
            "-m",
            "10",
            "http://example.invalid/via-proxy",
        ],
    )
    .await;
    assert_eq!(out.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), STUB_BODY);
    let head = heads.recv().await.unwrap();
    assert!(
        head.starts_with("GET http://example.invalid/via-proxy HTTP/1.1"),
        "{head}"
    );
    let basic = base64::engine::general_purpose::STANDARD.encode("sb-user:s3cret-token");
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("proxy-authorization: basic {basic}").to_ascii_lowercase()),
        "{head}"
    );

    // Ignoring the proxy leads nowhere: the host's loopback is not the sandbox's.
    let url = format!("http://127.0.0.1:{host_port}/");
    let out = run(
        &rt,
        &id,
        &["curl", "--noproxy", "*", "-sS", "-m", "5", &url],
    )
    .await;
    assert_ne!(
        out.code(),
        Some(0),
        "direct connection to the host succeeded"
    );
    assert!(
        text(&out.stderr).contains("Couldn't connect")
            || text(&out.stderr).contains("Failed to connect"),
        "{}",
        text(&out.stderr)
    );
    assert!(host.accept().is_err(), "the host server saw a connection");
    let out = run(
        &rt,
        &id,
        &[
            "curl",
            "--noproxy",
            "*",
            "-sS",
            "-m",
            "5",
            "http://1.1.1.1/",
        ],
    )
    .await;
    assert_ne!(out.code(), Some(0));
    assert!(
        text(&out.stderr).to_lowercase().contains("unreachable")
            || text(&out.stderr).contains("connect")
    );

    // Only loopback exists in the namespace.
    let out = run(&rt, &id, &["ip", "-o", "link", "show"]).await;
    assert_eq!(out.code(), Some(0), "{}", text(&out.stderr));
    let links: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(links.len(), 1, "{links:?}");
    assert!(links[0].contains(": lo:"), "{links:?}");

    rt.delete(&id).await.expect("delete");
}

/// Merges consecutive chunks of the same stream.
fn merged(events: &[ExecEvent]) -> Vec<(char, String)> {
    let mut out: Vec<(char, String)> = Vec::new();
    for event in events {
        let (tag, bytes): (char, &Bytes) = match event {
            ExecEvent::Stdout(b) => ('o', b),
            ExecEvent::Stderr(b) => ('e', b),
            ExecEvent::Exit(_) => continue,
        };
        match out.last_mut() {
            Some((last, s)) if *last == tag => s.push_str(&text(bytes)),
            _ => out.push((tag, text(bytes))),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_streams_in_order_with_exit_codes_and_a_clean_environment() {
    let Some((rt, _dir)) = runtime("exec", vec![]) else {
        return;
    };
    let id = id("exec");
    rt.create(spec(&id)).await.expect("create");

    let script = "echo out1; sleep 0.2; echo err1 >&2; sleep 0.2; echo out2; sleep 0.2; echo err2 >&2; exit 3";
    let mut handle = rt
        .exec(&id, ExecRequest::new(["sh", "-c", script]))
        .await
        .unwrap();
    let mut events = Vec::new();
    while let Some(event) = handle.next().await {
        events.push(event);
    }
    let Some(ExecEvent::Exit(exit)) = events.last().cloned() else {
        panic!("no exit event last: {events:?}");
    };
    assert_eq!(exit.code, Some(3));
    assert_eq!(exit.reason, ExitReason::Exited);
    assert_eq!(
        merged(&events),
        vec![
            ('o', "out1\n".to_string()),
            ('e', "err1\n".to_string()),
            ('o', "out2\n".to_string()),
            ('e', "err2\n".to_string()),
        ]
    );
    assert_eq!(run(&rt, &id, &["true"]).await.code(), Some(0));
    assert_eq!(run(&rt, &id, &["false"]).await.code(), Some(1));
    let missing = run(&rt, &id, &["no-such-command"]).await;
    assert_eq!(missing.code(), Some(127), "{}", text(&missing.stderr));

    // The environment is exactly what the gateway set, plus the exec's own.
    let mut request = ExecRequest::new(["env"]);
    request.env.insert("EXTRA".into(), "1".into());
    let out = rt.exec(&id, request).await.unwrap().collect().await;
    let env: BTreeMap<String, String> = text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    for key in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        expected.insert(key.into(), PROXY.into());
    }
    expected.insert("NO_PROXY".into(), "localhost,127.0.0.1,::1".into());
    expected.insert("no_proxy".into(), "localhost,127.0.0.1,::1".into());
    for key in CA_ENV_VARS {
        expected.insert(key.into(), "/sandgate/ca.pem".into());
    }
    expected.insert("API_TOKEN".into(), "sg-placeholder-123".into());
    expected.insert("EXTRA".into(), "1".into());
    expected.insert("HOME".into(), "/home/user".into());
    expected.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    assert_eq!(env, expected);
    let mut request = ExecRequest::new(["true"]);
    request
        .env
        .insert("HTTPS_PROXY".into(), "http://elsewhere:1".into());
    assert!(matches!(
        rt.exec(&id, request).await,
        Err(LocalboxError::Invalid(_))
    ));

    // The CA file is inside the sandbox, read-only.
    let out = run(&rt, &id, &["cat", "/sandgate/ca.pem"]).await;
    assert_eq!(text(&out.stdout), CA);
    assert_ne!(
        sh(&rt, &id, "echo x > /sandgate/ca.pem").await.code(),
        Some(0)
    );

    // Unprivileged user, own hostname, own PID namespace, cwd.
    let out = sh(
        &rt,
        &id,
        "id -u; id -G; hostname; pwd; cat /proc/1/comm; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines[0], "65534", "{lines:?}");
    assert_eq!(lines[1], "65534", "{lines:?}");
    assert_eq!(lines[2], format!("sandbox-{id}"));
    assert_eq!(lines[3], "/home/user");
    assert_eq!(lines[4], "bash");
    let visible: usize = lines[5].parse().unwrap();
    assert!(
        visible < 10,
        "{visible} processes visible: not a private PID namespace"
    );
    let mut request = ExecRequest::new(["pwd"]);
    request.cwd = Some("/tmp".into());
    assert_eq!(
        text(&rt.exec(&id, request).await.unwrap().collect().await.stdout),
        "/tmp\n"
    );
    // The base is read-only and setuid is off.
    assert_ne!(sh(&rt, &id, "touch /usr/x").await.code(), Some(0));
    assert_ne!(sh(&rt, &id, "touch /x").await.code(), Some(0));
    assert!(text(&sh(&rt, &id, "grep ' /usr ' /proc/mounts").await.stdout).contains("nosuid"));

    // Timeout kills the tree, the background child included.
    let baseline = rt.pids(&id).await.unwrap().len();
    let started = Instant::now();
    let mut request = ExecRequest::new(["sh", "-c", "sleep 60 & sleep 60"]);
    request.timeout = Some(Duration::from_millis(300));
    let out = rt.exec(&id, request).await.unwrap().collect().await;
    let exit = out.exit.unwrap();
    assert_eq!(exit.reason, ExitReason::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(
        rt.pids(&id).await.unwrap().len(),
        baseline,
        "the timeout left processes"
    );

    // Cancel and drop kill the whole tree (background child included).
    let handle = rt
        .exec(&id, ExecRequest::new(["sh", "-c", "sleep 60 & sleep 60"]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.pids(&id).await.unwrap().len() < baseline + 3 {
        assert!(
            Instant::now() < deadline,
            "the exec's processes never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.cancel();
    let out = handle.collect().await;
    assert_eq!(out.exit.unwrap().reason, ExitReason::Cancelled);
    assert_eq!(rt.pids(&id).await.unwrap().len(), baseline);

    let handle = rt
        .exec(&id, ExecRequest::new(["sh", "-c", "sleep 60 & sleep 60"]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.pids(&id).await.unwrap().len() < baseline + 3 {
        assert!(
            Instant::now() < deadline,
            "the exec's processes never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(handle);
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.pids(&id).await.unwrap().len() != baseline && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        rt.pids(&id).await.unwrap().len(),
        baseline,
        "dropping the handle left processes"
    );

    rt.delete(&id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_and_stay_confined() {
    let Some((rt, dir)) = runtime("files", vec![]) else {
        return;
    };
    let id = id("files");
    rt.create(spec(&id)).await.expect("create");

    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    rt.write_file(&id, "data.bin", binary.clone())
        .await
        .unwrap();
    assert_eq!(
        rt.read_file(&id, "/home/user/data.bin").await.unwrap(),
        binary
    );
    let out = sh(&rt, &id, "wc -c < data.bin; od -An -tx1 -N4 -j254 data.bin").await;
    assert_eq!(
        text(&out.stdout).split_whitespace().collect::<Vec<_>>(),
        ["70000", "fe", "ff", "00", "01"]
    );
    // Written inside, read outside.
    sh(&rt, &id, "printf 'a\\000b' > /tmp/in.bin").await;
    assert_eq!(rt.read_file(&id, "/tmp/in.bin").await.unwrap(), b"a\0b");
    // The sandbox user owns what the gateway writes.
    assert_eq!(
        sh(&rt, &id, "echo more >> data.bin && echo ok")
            .await
            .code(),
        Some(0)
    );

    rt.mkdir(&id, "a/b/c", true).await.unwrap();
    rt.write_file(&id, "a/b/c/f.txt", b"f".to_vec())
        .await
        .unwrap();
    let listing = rt.list_dir(&id, "a/b").await.unwrap();
    assert_eq!(listing.len(), 1);
    assert_eq!(
        (listing[0].name.as_str(), listing[0].kind),
        ("c", EntryKind::Dir)
    );
    assert!(rt.mkdir(&id, "a/b/c", false).await.is_err());
    assert!(rt.remove(&id, "a", false).await.is_err());
    rt.remove(&id, "a", true).await.unwrap();
    rt.remove(&id, "data.bin", false).await.unwrap();
    let names: Vec<String> = rt
        .list_dir(&id, "/home/user")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.is_empty(), "{names:?}");

    // Traversal is refused outright; mutations outside the writable areas too.
    for path in [
        "../../etc/passwd",
        "/home/user/../../../etc/shadow",
        "/tmp/../..",
    ] {
        assert!(
            matches!(
                rt.read_file(&id, path).await,
                Err(LocalboxError::InvalidPath { .. })
            ),
            "{path}"
        );
    }
    assert!(matches!(
        rt.write_file(&id, "/etc/evil", b"x".to_vec()).await,
        Err(LocalboxError::InvalidPath { .. })
    ));
    assert!(matches!(
        rt.remove(&id, "/home/user", true).await,
        Err(LocalboxError::InvalidPath { .. })
    ));
    assert!(
        rt.read_file(&id, "/etc/passwd").await.is_err(),
        "the host's /etc leaked through the files API"
    );

    // Symlinks the sandbox plants resolve inside its root, never on the host.
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "host secret").unwrap();
    let script = format!(
        "ln -s {o}/secret.txt abs && ln -s ../../../../../../../../{o}/secret.txt rel && ln -s {o} dirlink && ln -s / rootlink && ln -s {o}/new.txt dangling",
        o = outside.display()
    );
    assert_eq!(sh(&rt, &id, &script).await.code(), Some(0));
    for path in ["abs", "rel", "dirlink/secret.txt"] {
        assert!(
            rt.read_file(&id, path).await.is_err(),
            "{path} escaped the root"
        );
    }
    assert!(rt.list_dir(&id, "dirlink").await.is_err());
    assert!(rt.write_file(&id, "dangling", b"x".to_vec()).await.is_err());
    assert!(rt
        .write_file(&id, "dirlink/new.txt", b"x".to_vec())
        .await
        .is_err());
    assert!(!outside.join("new.txt").exists());
    assert!(rt
        .write_file(&id, "rootlink/etc/x", b"x".to_vec())
        .await
        .is_err());
    let kinds: Vec<(String, EntryKind)> = rt
        .list_dir(&id, ".")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert!(
        kinds.iter().all(|(_, k)| *k == EntryKind::Symlink),
        "{kinds:?}"
    );
    rt.remove(&id, "dirlink", true).await.unwrap();
    assert!(
        outside.join("secret.txt").exists(),
        "deleting a symlink removed its target"
    );

    // Another sandbox cannot see this one's files, by any path.
    rt.write_file(&id, "mine.txt", b"private".to_vec())
        .await
        .unwrap();
    let other = format!("{id}-b");
    rt.create(spec(&other)).await.expect("create second");
    let host_path = rt.sandbox_dir(&id).join("root/home/user/mine.txt");
    assert_eq!(std::fs::read(&host_path).unwrap(), b"private");
    let out = run(&rt, &other, &["cat", &host_path.to_string_lossy()]).await;
    assert_ne!(out.code(), Some(0));
    assert!(!text(&out.stdout).contains("private"));
    let out = sh(
        &rt,
        &other,
        "cat /proc/*/root/home/user/mine.txt; ls /home/user",
    )
    .await;
    assert!(
        !text(&out.stdout).contains("private"),
        "{}",
        text(&out.stdout)
    );
    assert!(rt.read_file(&other, "mine.txt").await.is_err());

    rt.delete(&other).await.expect("delete second");
    rt.delete(&id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_progress_and_resume_continues() {
    let Some((rt, _dir)) = runtime("pause", vec![]) else {
        return;
    };
    if !rt.capabilities().freezer {
        eprintln!("SKIPPED localbox::pause: no cgroup freezer");
        return;
    }
    pause_cycle(&rt, &id("pause")).await;
}

/// The same lifecycle through cgroup v2 (`cgroup.freeze`, `cgroup.kill`), which this
/// hybrid machine offers next to v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_v2_pause_kill_and_delete() {
    let Some((rt, _dir)) = runtime_with("cgroup_v2", vec![], CgroupMode::V2) else {
        return;
    };
    let caps = rt.capabilities();
    if caps.cgroup_version != Some(2) || !caps.freezer {
        eprintln!("SKIPPED localbox::cgroup_v2: no usable cgroup v2 hierarchy");
        return;
    }
    let id = id("v2");
    pause_cycle(&rt, &id).await;
    // Limits the v2 hierarchy cannot enforce here are refused, not silently dropped.
    if !caps.memory_limit {
        let mut limited = spec(&format!("{id}-lim"));
        limited.limits.memory_bytes = Some(64 << 20);
        assert!(matches!(
            rt.create(limited).await,
            Err(LocalboxError::Unsupported(_))
        ));
    }
}

/// Runs a counter, pauses (no progress, no exec), resumes (progress), cancels while
/// paused (the kill lands), then deletes and checks the groups are gone.
async fn pause_cycle(rt: &Arc<LocalRuntime>, id: &str) {
    rt.create(spec(id)).await.expect("create");
    let counter = rt
        .exec(
            id,
            ExecRequest::new([
                "sh",
                "-c",
                "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.tmp; mv /tmp/n.tmp /tmp/n; sleep 0.02; done",
            ]),
        )
        .await
        .unwrap();
    let groups = cgroup_dirs(counter.pid());
    assert!(!groups.is_empty(), "the exec is in no sandbox cgroup");
    let read = |rt: Arc<LocalRuntime>, id: String| async move {
        rt.read_file(&id, "/tmp/n")
            .await
            .ok()
            .and_then(|b| text(&b).trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while read(rt.clone(), id.to_string()).await < 5 {
        assert!(Instant::now() < deadline, "the counter never advanced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    rt.pause(id).await.unwrap();
    assert_eq!(rt.status(id).await.unwrap(), SandboxStatus::Paused);
    let frozen_at = read(rt.clone(), id.to_string()).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        read(rt.clone(), id.to_string()).await,
        frozen_at,
        "the counter advanced while paused"
    );
    assert!(matches!(
        rt.exec(id, ExecRequest::new(["true"])).await,
        Err(LocalboxError::State { .. })
    ));
    // Files stay readable while paused.
    assert!(rt.list_dir(id, "/tmp").await.is_ok());

    rt.resume(id).await.unwrap();
    assert_eq!(rt.status(id).await.unwrap(), SandboxStatus::Running);
    let deadline = Instant::now() + Duration::from_secs(10);
    while read(rt.clone(), id.to_string()).await <= frozen_at + 3 {
        assert!(Instant::now() < deadline, "the counter did not resume");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Cancelled while paused: the tree dies at the latest when the sandbox resumes.
    rt.pause(id).await.unwrap();
    counter.cancel();
    rt.resume(id).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(20), counter.collect())
        .await
        .expect("the cancelled exec never ended")
        .exit
        .unwrap();
    assert_eq!(exit.reason, ExitReason::Cancelled);

    rt.delete(id).await.expect("delete");
    for group in &groups {
        assert!(!group.exists(), "cgroup {} remains", group.display());
    }
}

fn cgroup_dirs(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    v1_groups(&text)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(CGROUP))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_start_limits_and_delete_leave_nothing_behind() {
    let Some((rt, _dir)) = runtime("delete", vec![]) else {
        return;
    };
    let caps = rt.capabilities();
    let id = id("del");
    let mut sandbox = spec(&id);
    sandbox.limits = Limits {
        memory_bytes: caps.memory_limit.then_some(256 << 20),
        cpu_millis: caps.cpu_limit.then_some(500),
        pids: caps.pids_limit.then_some(64),
        disk_bytes: caps.disk_limit.then_some(32 << 20),
    };
    let created = rt.create(sandbox).await.expect("create");
    assert_eq!(
        created.enforced.namespaces,
        ["net", "pid", "mount", "uts", "ipc"]
    );
    assert_eq!(
        created.enforced.memory_bytes,
        caps.memory_limit.then_some(256 << 20)
    );
    assert_eq!(created.enforced.cpu_millis, caps.cpu_limit.then_some(500));
    assert_eq!(created.enforced.pids, caps.pids_limit.then_some(64));
    assert_eq!(
        created.enforced.disk_bytes,
        caps.disk_limit.then_some(32 << 20)
    );
    let mut heads = serve_stub(created.listener);

    // The limits are really on the sandbox's processes.
    let handle = rt
        .exec(&id, ExecRequest::new(["sleep", "60"]))
        .await
        .unwrap();
    let groups = cgroup_dirs(handle.pid());
    if caps.memory_limit {
        let memory = groups
            .iter()
            .find(|p| p.starts_with("/sys/fs/cgroup/memory"))
            .expect("memory group");
        let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (256u64 << 20).to_string());
    }
    if caps.cpu_limit {
        let cpu = groups
            .iter()
            .find(|p| p.to_string_lossy().contains("/cpu"))
            .expect("cpu group");
        let quota = std::fs::read_to_string(cpu.join("cpu.cfs_quota_us")).unwrap();
        assert_eq!(quota.trim(), "50000");
    }
    drop(handle);
    if caps.memory_limit {
        // 400 MB held by `tail` (no newline in the input) exceeds the 256 MiB limit.
        let out = sh(
            &rt,
            &id,
            "head -c 400000000 /dev/zero | tail -n 1 >/dev/null; echo rc=$?",
        )
        .await;
        assert_eq!(text(&out.stdout).trim(), "rc=137", "{}", text(&out.stderr));
    }
    if caps.cpu_limit {
        let mut busy = ExecRequest::new(["sh", "-c", "while :; do :; done"]);
        busy.timeout = Some(Duration::from_millis(1500));
        let handle = rt.exec(&id, busy).await.unwrap();
        let groups = cgroup_dirs(handle.pid());
        let out = handle.collect().await;
        assert_eq!(out.exit.unwrap().reason, ExitReason::TimedOut);
        let cpu = groups
            .iter()
            .find(|p| p.to_string_lossy().contains("/cpu"))
            .expect("cpu group");
        let stat = std::fs::read_to_string(cpu.join("cpu.stat")).unwrap();
        let throttled: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(throttled > 0, "a busy loop was never throttled: {stat}");
    }

    if caps.pids_limit {
        // 100 sleepers do not fit under 64 processes; the kernel counts the refusals.
        let out = sh(
            &rt,
            &id,
            "for i in $(seq 100); do sleep 5 & done 2>/dev/null; echo spawned",
        )
        .await;
        assert!(rt.limit_hits(&id).unwrap().pids_refused > 0, "{out:?}");
        rt.stop(&id).await.unwrap();
        rt.start(&id).await.unwrap();
    }
    if caps.disk_limit {
        // /home/user and /tmp share 32 MiB: writing 64 MiB across them fails inside.
        let out = sh(
            &rt,
            &id,
            "dd if=/dev/zero of=/tmp/a bs=1M count=16 2>/dev/null; \
             dd if=/dev/zero of=/home/user/b bs=1M count=48 2>/dev/null; echo rc=$?",
        )
        .await;
        assert_eq!(text(&out.stdout).trim(), "rc=1", "{}", text(&out.stderr));
        assert!(rt.limit_hits(&id).unwrap().disk_full);
        let _ = sh(&rt, &id, "rm -f /tmp/a /home/user/b").await;
        assert!(!rt.limit_hits(&id).unwrap().disk_full);
    }

    // stop keeps files and the listener; start brings processes back.
    rt.write_file(&id, "keep.txt", b"kept".to_vec())
        .await
        .unwrap();
    rt.stop(&id).await.unwrap();
    assert_eq!(rt.status(&id).await.unwrap(), SandboxStatus::Stopped);
    assert!(rt.pids(&id).await.unwrap().is_empty());
    assert!(matches!(
        rt.exec(&id, ExecRequest::new(["true"])).await,
        Err(LocalboxError::State { .. })
    ));
    rt.start(&id).await.unwrap();
    assert_eq!(
        text(&run(&rt, &id, &["cat", "keep.txt"]).await.stdout),
        "kept"
    );
    let out = run(
        &rt,
        &id,
        &["curl", "-sS", "-m", "10", "http://127.0.0.1:3128/again"],
    )
    .await;
    assert_eq!(text(&out.stdout), STUB_BODY, "{}", text(&out.stderr));
    assert!(heads.recv().await.unwrap().starts_with("GET /again"));

    // Leave something running in the background, then delete.
    assert_eq!(
        sh(&rt, &id, "nohup sleep 1000 >/dev/null 2>&1 & echo started")
            .await
            .code(),
        Some(0)
    );
    let pids = rt.pids(&id).await.unwrap();
    assert!(pids.len() >= 3, "{pids:?}");
    let groups = cgroup_dirs(pids[pids.len() - 1]);
    let netns = rt.netns_name(&id);
    let dir = rt.sandbox_dir(&id);
    let netns_list = || {
        let out = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap();
        text(&out.stdout)
    };
    assert!(netns_list()
        .lines()
        .any(|l| l.split_whitespace().next() == Some(netns.as_str())));
    assert!(dir.exists());

    rt.delete(&id).await.expect("delete");

    assert!(!netns_list()
        .lines()
        .any(|l| l.split_whitespace().next() == Some(netns.as_str())));
    assert!(!Path::new("/run/netns").join(&netns).exists());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&*dir.to_string_lossy()), "a mount remains");
    assert!(!mounts.contains(&netns), "the netns mount remains");
    assert!(!dir.exists(), "the directory remains");
    for pid in &pids {
        let gone = eventually(Duration::from_secs(10), || {
            !Path::new(&format!("/proc/{pid}")).exists()
        })
        .await;
        assert!(gone, "process {pid} survived the delete");
    }
    for group in &groups {
        assert!(!group.exists(), "cgroup {} remains", group.display());
    }
    assert!(matches!(
        rt.status(&id).await,
        Err(LocalboxError::NotFound(_))
    ));
    assert!(rt.list().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_restores_into_a_new_sandbox() {
    let Some((rt, dir)) = runtime("snapshot", vec![]) else {
        return;
    };
    let id = id("snap");
    rt.create(spec(&id)).await.expect("create");
    let binary: Vec<u8> = (0..=255u8).rev().cycle().take(5000).collect();
    rt.mkdir(&id, "proj/src", true).await.unwrap();
    rt.write_file(&id, "proj/src/blob.bin", binary.clone())
        .await
        .unwrap();
    sh(
        &rt,
        &id,
        "echo scratch > /tmp/scratch.txt && ln -s src/blob.bin proj/link",
    )
    .await;
    let archive = dir.path().join("snap.tar");
    let size = rt.snapshot(&id, &archive).await.unwrap();
    assert!(size > 5000);

    let copy = format!("{id}-copy");
    let mut copy_spec = spec(&copy);
    copy_spec.from_snapshot = Some(archive.clone());
    rt.create(copy_spec).await.expect("create from snapshot");
    assert_eq!(
        rt.read_file(&copy, "proj/src/blob.bin").await.unwrap(),
        binary
    );
    assert_eq!(
        rt.read_file(&copy, "/tmp/scratch.txt").await.unwrap(),
        b"scratch\n"
    );
    let out = run(
        &rt,
        &copy,
        &[
            "sh",
            "-c",
            "readlink proj/link; stat -c %u proj/src/blob.bin",
        ],
    )
    .await;
    assert_eq!(text(&out.stdout), "src/blob.bin\n65534\n");
    assert!(!rt
        .sandbox_dir(&copy)
        .join("root/sandgate/restore.tar")
        .exists());

    // A crafted archive cannot write outside the new sandbox.
    let evil = dir.path().join("evil.tar");
    let staging = dir.path().join("evil");
    std::fs::create_dir_all(staging.join("home/user")).unwrap();
    let target = dir.path().join("pwned");
    std::os::unix::fs::symlink(dir.path(), staging.join("home/user/escape")).unwrap();
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&staging)
        .arg("-cf")
        .arg(&evil)
        .args(["home/user/escape"])
        .status()
        .unwrap();
    assert!(status.success());
    // Append a file that would land through the symlink.
    let mut file = std::fs::File::create(staging.join("pwned")).unwrap();
    file.write_all(b"x").unwrap();
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&staging)
        .arg("-rf")
        .arg(&evil)
        .arg("--transform=s,^pwned,home/user/escape/pwned,")
        .arg("pwned")
        .status()
        .unwrap();
    assert!(status.success());
    let evil_id = format!("{id}-evil");
    let mut evil_spec = spec(&evil_id);
    evil_spec.from_snapshot = Some(evil);
    let _ = rt.create(evil_spec).await;
    assert!(!target.exists(), "the archive wrote outside the sandbox");
    if rt.list().contains(&evil_id) {
        rt.delete(&evil_id).await.unwrap();
    }
    assert!(!rt.sandbox_dir(&evil_id).exists());

    rt.delete(&copy).await.unwrap();
    rt.delete(&id).await.unwrap();
}

/// The python3 that has `requests` on this machine (its prefix), if any.
fn python_with_requests() -> Option<(PathBuf, PathBuf)> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, requests; print(sys.prefix); print(sys.executable)",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = text(&out.stdout);
    let mut lines = text.lines();
    let prefix = PathBuf::from(lines.next()?);
    let exe = PathBuf::from(lines.next()?);
    Some((prefix, exe))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_sees_the_proxy_and_the_ca() {
    if !root_or_skip("localbox::python") {
        return;
    }
    let Some((prefix, exe)) = python_with_requests() else {
        eprintln!("SKIPPED localbox::python: no python3 with requests on this machine");
        return;
    };
    // A Python outside /usr (pyenv) is bound into the base read-only.
    let extra = if prefix.starts_with("/usr") {
        vec![]
    } else {
        vec![prefix.clone()]
    };
    let Some((rt, _dir)) = runtime("python", extra) else {
        return;
    };
    let id = id("py");
    let created = rt.create(spec(&id)).await.expect("create");
    let mut heads = serve_stub(created.listener);
    let script = r#"
import os, requests
s = requests.Session()
settings = s.merge_environment_settings("https://api.example.com/", {}, None, None, None)
print(settings["proxies"].get("https"))
print(settings["verify"])
print(os.environ.get("API_TOKEN"))
r = requests.get("http://api.example.com/py", timeout=10)
print(r.status_code, r.text)
"#;
    let out = run(&rt, &id, &[&exe.to_string_lossy(), "-c", script]).await;
    assert_eq!(out.code(), Some(0), "stderr: {}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines[0], PROXY);
    assert_eq!(lines[1], "/sandgate/ca.pem");
    assert_eq!(lines[2], "sg-placeholder-123");
    assert_eq!(lines[3], format!("200 {STUB_BODY}"));
    let head = heads.recv().await.unwrap();
    assert!(
        head.starts_with("GET http://api.example.com/py HTTP/1.1"),
        "{head}"
    );
    rt.delete(&id).await.expect("delete");
}

/// Set in the child process of [`missing_capability_is_named`].
const PRIV_CHILD: &str = "SANDGATE_LOCALBOX_PRIVILEGE_CHILD";

/// Runs in a child whose bounding set lacks CAP_SYS_ADMIN: the runtime must refuse to
/// start and say what is missing. A no-op when run normally.
#[test]
fn privilege_probe_child() {
    if std::env::var_os(PRIV_CHILD).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    match LocalRuntime::new(RuntimeConfig::new(dir.path().join("s"))) {
        Ok(_) => println!("RESULT: started without CAP_SYS_ADMIN"),
        Err(e) => println!("RESULT: {e}"),
    }
}

#[test]
fn missing_capability_is_named() {
    if !root_or_skip("localbox::missing_capability_is_named") {
        return;
    }
    let Some(setpriv) = which("setpriv") else {
        eprintln!("SKIPPED localbox::missing_capability_is_named: setpriv is not installed");
        return;
    };
    let out = std::process::Command::new(setpriv)
        .args(["--bounding-set", "-sys_admin", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "localbox::privilege_probe_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PRIV_CHILD, "1")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    let result = stdout
        .lines()
        .find_map(|l| l.split_once("RESULT: ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("child said nothing: {stdout} {}", text(&out.stderr)));
    assert!(result.contains("missing CAP_SYS_ADMIN"), "{result}");
    assert!(result.contains("run sandgate as root"), "{result}");
    assert!(!result.contains("CAP_NET_ADMIN"), "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_of_a_crashed_gateway_are_purged() {
    let Some((crashed, dir)) = runtime("orphans", vec![]) else {
        return;
    };
    let id = id("orphan");
    let created = crashed.create(spec(&id)).await.expect("create");
    drop(created.listener);
    assert_eq!(
        sh(&crashed, &id, "nohup sleep 1000 >/dev/null 2>&1 & echo ok")
            .await
            .code(),
        Some(0)
    );
    let pids = crashed.pids(&id).await.unwrap();
    let groups = cgroup_dirs(pids[pids.len() - 1]);
    assert!(!groups.is_empty() || !crashed.capabilities().freezer);
    let netns = crashed.netns_name(&id);
    let sandbox_dir = crashed.sandbox_dir(&id);
    // A crash: nothing runs the runtime's cleanup, processes keep running.
    std::mem::forget(crashed);
    for pid in &pids {
        assert!(Path::new(&format!("/proc/{pid}")).exists());
    }

    let mut config = RuntimeConfig::new(dir.path().join("sandboxes"));
    config.netns_prefix = NETNS_PREFIX.into();
    config.cgroup_name = CGROUP.into();
    let restarted = LocalRuntime::new(config).unwrap();
    let kept = format!("{id}-kept");
    restarted.create(spec(&kept)).await.expect("create");
    assert_eq!(restarted.purge_orphans().await.unwrap(), vec![id.clone()]);

    assert!(!Path::new("/run/netns").join(&netns).exists());
    assert!(!sandbox_dir.exists());
    for pid in &pids {
        let gone = eventually(Duration::from_secs(10), || {
            // A killed child of the forgotten runtime stays a zombie until reaped.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    s.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                })
                .unwrap_or(true)
        })
        .await;
        assert!(gone, "process {pid} survived the purge");
    }
    for group in &groups {
        assert!(!group.exists(), "cgroup {} remains", group.display());
    }
    // The live sandbox was not touched.
    assert_eq!(run(&restarted, &kept, &["true"]).await.code(), Some(0));
    restarted.delete(&kept).await.unwrap();
}

/// Under CI a root-only test that cannot run fails instead of skipping; elsewhere it skips.
#[test]
fn ci_fails_a_root_only_test_it_cannot_run() {
    assert_eq!(skip_verdict("t", None, true), Ok(true));
    assert_eq!(skip_verdict("t", None, false), Ok(true));
    assert_eq!(
        skip_verdict("t", Some("not running as root"), false),
        Ok(false)
    );
    let err = skip_verdict("t", Some("not running as root"), true).unwrap_err();
    assert!(
        err.contains("not running as root") && err.contains("CI"),
        "{err}"
    );
}
