//! Master key rotation without downtime (issue 15, item 6): real `sandgate serve` processes
//! and `sandgate store rekey`, a credential injected over real TLS through the proxy.
//!
//! Sealed under the old key: a credential, a sandbox's egress token, the placeholder seed.
//! With the new key current and the old one accepted, the gateway serves them all, and
//! `store rekey` (run while it serves) re-seals them; afterwards the new key alone serves
//! the same sandbox with the same placeholder, the old key alone cannot start, and a key
//! that opens nothing makes `rekey` name the rows it cannot open (never their values).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN: &str = "api-token-rekey-0123456789";
const SECRET: &str = "rekey-credential-secret-5e1f";

fn new_key(path: &Path) -> PathBuf {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(path, hex).unwrap();
    path.to_path_buf()
}

/// The config with `current` sealing and `accepted` opening; written to `name`.
fn config(dir: &Path, ca: &TestCa, name: &str, current: &Path, accepted: &[&Path]) -> PathBuf {
    let extra = format!(
        r#"
[[api.tokens]]
token = "{TOKEN}"
principal = "alice"
workspace = "ws-a"
[dns.hosts]
"api.a.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.0/8"]
[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct"
egress = "gateway"
[simulated.pool-a]
state_file = {state:?}
"#,
        state = dir.join("pool-a.json").display().to_string()
    );
    let text = process_config(dir, "", "", &extra).replacen(
        "[tls]\n",
        &format!(
            "[tls]\nupstream_ca_files = [{:?}]\n",
            ca.pem_path.display().to_string()
        ),
        1,
    );
    let key_line = format!(
        "master_key_file = {:?}",
        dir.join("data/master.key").display().to_string()
    );
    assert!(text.contains(&key_line));
    let accepted: Vec<String> = accepted.iter().map(|p| p.display().to_string()).collect();
    let text = text.replace(
        &key_line,
        &format!(
            "master_key_file = {:?}\naccepted_key_files = {accepted:?}",
            current.display().to_string()
        ),
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn serve(config: &Path) -> Served {
    let mut command = Command::new(BIN);
    command.args(["serve", "--config"]).arg(config);
    serve_process(command)
}

fn rekey(config: &Path) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(["store", "rekey", "--config"])
        .arg(config)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn call(replica: &Served, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut req = reqwest::Client::new()
        .request(method, format!("http://{}{path}", replica.api))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

/// A request as the sandbox through `replica`'s proxy, with the placeholder in its slot;
/// the `authorization` the origin received.
async fn through(
    replica: &Served,
    dir: &Path,
    origin: &Origin,
    id: &str,
    token: &str,
    placeholder: &str,
) -> Option<String> {
    let ca = std::fs::read(dir.join("certs/ca.pem")).unwrap();
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{id}:{token}@{}", replica.proxy)).unwrap())
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let resp = client
        .get(format!("https://api.a.test:{}/x", origin.port()))
        .header("authorization", format!("Bearer {placeholder}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    origin
        .last()
        .and_then(|s| s.headers.get("authorization").cloned())
}

async fn placeholder(replica: &Served, id: &str) -> String {
    let env = call(
        replica,
        reqwest::Method::GET,
        &format!("/v1/identities/{id}/env"),
        None,
    )
    .await;
    env["placeholders"]["api"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_key_rotates_while_the_gateway_serves() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let old = dir.join("data/master.key");
    let expected = format!("Bearer {SECRET}");

    // Before: everything sealed under the old key (generated at first start).
    let before = config(dir, &ca, "before.toml", &old, &[]);
    let gw = serve(&before);
    call(
        &gw,
        reqwest::Method::POST,
        "/v1/workspaces/ws-a/credentials",
        Some(json!({
            "name": "api", "secret": SECRET,
            "destinations": [{"host": "api.a.test", "ports": [origin.port()]}],
            "apply": {"type": "header", "name": "authorization", "template": "Bearer {secret}"},
        })),
    )
    .await;
    let created = call(
        &gw,
        reqwest::Method::POST,
        "/v1/sandboxes",
        Some(json!({
            "network": {"allow_domains": ["api.a.test"]}, "credentials": ["api"],
        })),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_string();
    let token = created["egress"]["token"].as_str().unwrap().to_string();
    let held = placeholder(&gw, &id).await;
    assert_eq!(
        through(&gw, dir, &origin, &id, &token, &held)
            .await
            .as_deref(),
        Some(expected.as_str())
    );
    drop(gw);

    // The new key current, the old accepted: the gateway serves what the old key sealed,
    // and `rekey`, run while it serves, re-seals all of it.
    let new = new_key(&dir.join("new.key"));
    let during = config(dir, &ca, "during.toml", &new, &[&old]);
    let gw = serve(&during);
    assert_eq!(
        placeholder(&gw, &id).await,
        held,
        "placeholders survive the rotation"
    );
    assert_eq!(
        through(&gw, dir, &origin, &id, &token, &held)
            .await
            .as_deref(),
        Some(expected.as_str())
    );
    let (code, out, err) = rekey(&during);
    assert_eq!(code, 0, "{out}{err}");
    for line in [
        "credentials: 1 re-sealed, 0 already under the current key, 0 changed meanwhile",
        "sandbox egress tokens: 1 re-sealed",
        "store secrets (placeholder seed): 1 re-sealed",
        "every secret is sealed under the current key",
    ] {
        assert!(out.contains(line), "{line:?} in {out}");
    }
    for secret in [SECRET, token.as_str(), held.as_str()] {
        assert!(!out.contains(secret) && !err.contains(secret), "{out}{err}");
    }
    let (code, again, _) = rekey(&during);
    assert_eq!(code, 0);
    assert!(
        again.contains("credentials: 0 re-sealed, 1 already under the current key"),
        "{again}"
    );
    assert_eq!(
        through(&gw, dir, &origin, &id, &token, &held)
            .await
            .as_deref(),
        Some(expected.as_str())
    );
    drop(gw);

    // After: the new key alone serves the same sandbox, credential and placeholder.
    let after = config(dir, &ca, "after.toml", &new, &[]);
    let gw = serve(&after);
    assert_eq!(placeholder(&gw, &id).await, held);
    assert_eq!(
        through(&gw, dir, &origin, &id, &token, &held)
            .await
            .as_deref(),
        Some(expected.as_str())
    );
    drop(gw);

    // The old key alone opens nothing any more: the gateway refuses to start, clearly.
    let stale = config(dir, &ca, "stale.toml", &old, &[]);
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&stale)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("wrong master key"), "{err}");
    assert!(!err.contains(SECRET), "{err}");

    // A key that opens nothing: rekey names the rows and fails, changing nothing.
    let unrelated = new_key(&dir.join("unrelated.key"));
    let wrong = config(dir, &ca, "wrong.toml", &unrelated, &[]);
    let (code, out, err) = rekey(&wrong);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("credential ws-a/api: opens under none of the keys"),
        "{err}"
    );
    assert!(
        err.contains(&format!("sandbox {id} (egress token)")),
        "{err}"
    );
    let gw = serve(&after);
    assert_eq!(
        through(&gw, dir, &origin, &id, &token, &held)
            .await
            .as_deref(),
        Some(expected.as_str())
    );
}
