//! sandgate's own SDKs (`sdk/python`, `sdk/typescript`) against a real gateway: the scenario
//! suites (`tests/it/sdk_python.rs`, `tests/it/sdk_typescript.rs`) start the gateway here and
//! run the language's scenario file against it over real sockets.
//!
//! The gateway: two API tokens (alice in `ws-a`, bob in `ws-b`); a simulated provider whose
//! pool `sim-slow` fails every create slowly (so a create answers 202 and is followed over
//! the events stream) and whose pool `sim-full` has no capacity, then the local pool, then a
//! healthy simulated pool `sim-ok` of provider `sim-late` (whose sandboxes run no commands:
//! 501), then the hosted pool `daytona` on the fake Daytona (`fakes::daytona`, a real socket),
//! ranked in that order by price and configured in it (providers too: a create without
//! priorities follows the providers' order); so a create advances twice before it runs
//! locally. The fake Daytona's toolbox fault (`POST|DELETE {SANDGATE_FAKE_DAYTONA}/_fake/
//! toolbox-fault`) makes its toolbox answer 500, so an operation on a sandbox placed there
//! fails at the provider: the API's 502 `UpstreamError`; its hang (`{"hang_ms": N}`) holds
//! toolbox calls past the account's 2 s `request_timeout_secs`: 504 `upstream_timeout`, also
//! `UpstreamError`. A creation policy refuses `labels.tier = "blocked"`; at most two event streams
//! are open at once (the rate-limit scenario opens a third), each for one second: a
//! create (`sim-slow` takes 1.5 s to fail) outlives its first stream, so the clients must
//! resume with `Last-Event-ID`. An HTTPS origin (this test's
//! CA) answers as `api.allowed.test` and `api.other.test`: the credential scenario binds a
//! credential to the first and checks, from inside a sandbox, that only it gets the secret.
//!
//! The scenario runners get `SANDGATE_URL`, `SANDGATE_TOKEN` (alice), `SANDGATE_TOKEN_B`,
//! `SANDGATE_WORKSPACE`, `SANDGATE_ORIGIN_PORT`, `SANDGATE_FAKE_DAYTONA` (the fake's URL),
//! `SANDGATE_CA` (the gateway's CA certificate), `SANDGATE_PORTS_ADDR` (its ports listener),
//! `SANDGATE_STORE_PATH` (the gateway's SQLite database: the InternalError scenario takes a
//! table away from under the running gateway) and `SANDGATE_SNAPSHOT_DIR` (where the local
//! provider keeps snapshots, to see that a snapshot sandgate could not record is removed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::fakes::daytona::{FakeDaytona, FakeDaytonaConfig};
use super::*;

pub const TOKEN_A: &str = "api-token-sdk-alice-0123456789";
pub const TOKEN_B: &str = "api-token-sdk-bob-0123456789";

const CREATION: &str = r#"package sandgate.creation

import rego.v1

deny contains "the SDK scenarios refuse labels.tier = blocked" if {
	input.sandbox.labels.tier == "blocked"
}
"#;

pub struct ScenarioGateway {
    pub gw: Gateway,
    pub origin: Origin,
    pub daytona: FakeDaytona,
    _ca: TestCa,
    dir: tempfile::TempDir,
}

/// The gateway of the module documentation; `None` when the test is skipped (not root,
/// outside CI: see [`root_or_skip`]). `prefix` keeps two suites' network namespaces and
/// cgroups apart when they run at once.
pub async fn start(test: &str, prefix: &str) -> Option<ScenarioGateway> {
    if !root_or_skip(test) {
        return None;
    }
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(
        ca.server_config(&["api.allowed.test", "api.other.test"]),
    ))
    .await;
    let daytona = FakeDaytona::start(FakeDaytonaConfig {
        start_delay: Duration::from_millis(50),
        ..FakeDaytonaConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let daytona_key = dir.path().join("daytona.key");
    std::fs::write(&daytona_key, daytona.api_key()).unwrap();
    let extra_toml = format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{TOKEN_B}"
principal = "bob"
workspace = "ws-b"

[create]
short_wait_ms = 300
janitor_interval_ms = 250
reconcile_window_ms = 1000
retry_backoff_ms = 20
event_streams_max = 2
event_stream_max_secs = 1

[[providers]]
name = "sim"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}
[[providers]]
name = "local"
kind = "local"
[[providers]]
name = "sim-late"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}
[[providers]]
name = "daytona"

[[accounts]]
name = "acct-slow"
provider = "sim"
[[accounts]]
name = "acct-full"
provider = "sim"
[[accounts]]
name = "local"
provider = "local"
[[accounts]]
name = "acct-ok"
provider = "sim-late"
[[accounts]]
name = "daytona-main"
provider = "daytona"
base_url = "{daytona_url}"
api_key_file = {daytona_key:?}
options = {{ request_timeout_secs = "2" }}

[[pools]]
name = "sim-slow"
provider = "sim"
account = "acct-slow"
price = 1.0
[[pools]]
name = "sim-full"
provider = "sim"
account = "acct-full"
price = 2.0
[[pools]]
name = "local"
provider = "local"
account = "local"
price = 3.0
capacity = 16
[[pools]]
name = "sim-ok"
provider = "sim-late"
account = "acct-ok"
price = 4.0
[[pools]]
name = "daytona"
provider = "daytona"
account = "daytona-main"
price = 5.0

[simulated.sim-slow]
latency_ms = {{ min = 1500, max = 1500 }}
faults = {{ fail_before_running = 1.0 }}
[simulated.sim-full]
faults = {{ capacity = 1.0 }}

[local]
dir = "{dir}/sandboxes"
snapshot_dir = "{dir}/snapshots"
netns_prefix = "{prefix}"
cgroup = "sandgate-{cgroup}"
"#,
        dir = dir.path().display(),
        cgroup = prefix.trim_end_matches('-'),
        daytona_url = daytona.api_url(),
        daytona_key = daytona_key.display().to_string(),
    );
    let gw = Gateway::start(GatewayOptions {
        identities: vec![],
        hosts: vec![
            ("api.allowed.test", "127.0.0.1"),
            ("api.other.test", "127.0.0.1"),
        ],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_policies: vec![("sdk_creation.rego", CREATION.to_string())],
        extra_toml,
        ..GatewayOptions::default()
    })
    .await;
    Some(ScenarioGateway {
        gw,
        origin,
        daytona,
        _ca: ca,
        dir,
    })
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Runs `command` (a scenario runner) against `env`'s gateway and fails the test, with
/// everything it printed, unless it exits 0. The gateway runs on this test's runtime, so the
/// runner is awaited, never waited on with a blocking call.
pub async fn run(env: &ScenarioGateway, mut command: tokio::process::Command, what: &str) {
    command
        .env(
            "SANDGATE_URL",
            format!("http://{}", env.gw.server.api_addr()),
        )
        .env("SANDGATE_TOKEN", TOKEN_A)
        .env("SANDGATE_TOKEN_B", TOKEN_B)
        .env("SANDGATE_WORKSPACE", "ws-a")
        .env("SANDGATE_ORIGIN_PORT", env.origin.port().to_string())
        .env("SANDGATE_FAKE_DAYTONA", env.daytona.url())
        .env(
            "SANDGATE_STORE_PATH",
            env.gw.dir.path().join("data/sandgate.db"),
        )
        .env("SANDGATE_SNAPSHOT_DIR", env.dir.path().join("snapshots"))
        .env("SANDGATE_CA", env.gw.server.ca_cert_path())
        .env(
            "SANDGATE_PORTS_ADDR",
            env.gw
                .server
                .ports_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
        )
        // The runner talks to the gateway on loopback; a proxy from the environment must not
        // take that traffic.
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env("NO_PROXY", "*")
        .current_dir(repo())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(240), command.output())
        .await
        .unwrap_or_else(|_| panic!("{what} ran for 240 s"))
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    eprintln!("{what}:\n{stdout}");
}
