//! Every capability a provider kind declares, driven through the gateway's API against its
//! fake, and every one it does not declare refused (issue 28, item 3).
//!
//! Table-driven: the `case_tests!` table has one entry per kind, the local provider and the
//! ten hosted ones, each with its fake (`tests/it/common/fakes`; local needs none: its
//! sandboxes are real namespaces, so that case needs root like `tests/it/local_provider.rs`).
//! One test per kind (the harness runs them side by side, each on its own gateway and fake)
//! starts an in-process gateway with one pool of that kind whose provider declares exactly
//! the kind's table (a hosted kind's `CAPABILITIES`, the local kind's built-in one) under
//! `[providers.capabilities.features]`: without it the router's view is the seed's table
//! narrowed to the adapter, which leaves off what the seed does not confirm (E2B's list,
//! delete, mkdir and cancel, for one) and this test is that confirmation against the fake.
//! It checks that `GET /v1/pools` shows that table (and that a hosted sandbox's view names
//! its egress enforcement with the pool's word), creates a sandbox placed there by naming
//! the provider and asking for every declared feature (so the baseline is off where the
//! kind has none: lifecycle-only kinds), waits until it runs, then for each of the 12 flags:
//!
//! - declared: the operation really works at the fake (a command's stdout and exit code,
//!   hundreds of lines in order, a long command cancelled early and gone from this machine,
//!   bytes written then read back and seen in the fake's instance, listed, deleted there, a
//!   directory made, pause then resume with the fake's state observed);
//! - undeclared: the API answers 501 `unsupported` naming the provider, and the fake saw
//!   no change (no mutating request, same state; a refused cancel lets the command finish).
//!
//! The `/v1` API has no endpoint for `filesystem.append`, `public_ports` or `pty`: those
//! three flags are checked only in the router's view (`GET /v1/pools`), never driven, and
//! an undeclared one has nothing to refuse. `process.ordered_output` has no endpoint of its
//! own either: declared, hundreds of stdout lines must come back in order; undeclared,
//! commands still run (that is `process.execute`), so nothing is refused.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::fakes::blaxel::{FakeBlaxel, FakeBlaxelConfig};
use crate::common::fakes::cloudflare::FakeCloudflare;
use crate::common::fakes::codesandbox::{FakeCodesandbox, FakeConfig as FakeCodesandboxConfig};
use crate::common::fakes::daytona::{FakeDaytona, FakeDaytonaConfig};
use crate::common::fakes::e2b::{FakeE2b, FakeE2bConfig};
use crate::common::fakes::freestyle::{FakeFreestyle, FakeFreestyleConfig};
use crate::common::fakes::modal::{FakeModal, FakeModalConfig, BASE_IMAGE};
use crate::common::fakes::northflank::{FakeNorthflank, FakeNorthflankConfig};
use crate::common::fakes::prime::{FakePrime, FakePrimeConfig};
use crate::common::fakes::runloop::{FakeRunloop, FakeRunloopConfig};
use crate::common::fakes::vercel::{FakeVercel, FakeVercelConfig};
use crate::common::*;
use sandgate_router::ProviderKind;

const API_TOKEN: &str = "api-token-capabilities-0123456789";
/// The E2B facade's key, for the same principal as [`API_TOKEN`].
const E2B_KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";
/// Deadlines for polling on a loaded 2-core machine, never sleeps the outcome depends on.
const RUNNING_WITHIN: Duration = Duration::from_secs(60);
const EXEC_WITHIN: Duration = Duration::from_secs(30);
/// How long the command a cancel must end runs otherwise: far beyond [`CANCELLED_WITHIN`].
const LONG_COMMAND_SECS: u64 = 120;
const CANCELLED_WITHIN: Duration = Duration::from_secs(20);
/// Lines the ordered-output check prints.
const LINES: usize = 400;

/// A provider's fake, as this test drives it.
trait Fake: Send + Sync {
    /// The `[[accounts]]` keys of an account on this fake after `provider`: `base_url`,
    /// `api_key_file` (written under `keys`) and `options`.
    fn account(&self, keys: &Path) -> String;
    /// What the fake holds of `instance` that an operation would change: its state and the
    /// mutating requests it has seen (or, for a fake that logs none, its commands and files).
    fn effects(&self, instance: &str) -> String;
    /// The instance's state at the fake, in the fake's words.
    fn state(&self, instance: &str) -> String;
    /// The bytes of the file at `path` (a sandbox path) in the fake's instance, read on
    /// this machine; `None` when absent. `Err` for a fake this test cannot look into.
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        let _ = (instance, path);
        Err(())
    }
}

type Starting = std::pin::Pin<Box<dyn std::future::Future<Output = Box<dyn Fake>> + Send>>;

/// One provider kind.
struct Case {
    /// The kind's name: the `[[providers]]` name and the one an `unsupported` message gives.
    kind: &'static str,
    /// Its sandboxes' home directory at the fake (files are made there).
    home: &'static str,
    /// Starts its fake; `None` for the local provider.
    start: Option<fn() -> Starting>,
}

macro_rules! case_tests {
    ($($test:ident => $case:expr,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                run(&$case).await;
            }
        )*
    };
}

case_tests! {
    local => Case { kind: "local", home: "/home/user", start: None },
    e2b => Case { kind: "e2b", home: "/home/user", start: Some(start_e2b) },
    daytona => Case { kind: "daytona", home: "/home/daytona", start: Some(start_daytona) },
    vercel => Case { kind: "vercel", home: "/vercel/sandbox", start: Some(start_vercel) },
    runloop => Case { kind: "runloop", home: "/home/user", start: Some(start_runloop) },
    prime_intellect => Case { kind: "prime-intellect", home: "/root", start: Some(start_prime) },
    blaxel => Case { kind: "blaxel", home: "/home/user", start: Some(start_blaxel) },
    cloudflare => Case { kind: "cloudflare", home: "/workspace", start: Some(start_cloudflare) },
    modal => Case { kind: "modal", home: "/root", start: Some(start_modal) },
    northflank => Case { kind: "northflank", home: "/root", start: Some(start_northflank) },
    freestyle => Case { kind: "freestyle", home: "/root", start: Some(start_freestyle) },
    codesandbox => Case { kind: "codesandbox", home: "/project", start: Some(start_codesandbox) },
}

/// The kind's table: what its adapter declares (a hosted kind's `CAPABILITIES`) or, for the
/// local provider, its built-in capabilities.
fn declared(kind: &str) -> [(&'static str, bool); 12] {
    let k = ProviderKind::from_name(kind).unwrap();
    match sandgate::providers::hosted::ceiling(k) {
        Some(caps) => caps.flags(),
        None => k.builtin_capabilities().feature_flags(),
    }
}

fn flag(table: &[(&'static str, bool); 12], path: &str) -> bool {
    table
        .iter()
        .find(|(p, _)| p.trim_start_matches("features.") == path)
        .unwrap_or_else(|| panic!("no flag {path}"))
        .1
}

/// The table as a request's or a provider's `features` (nested objects).
fn features_json(table: &[(&'static str, bool); 12]) -> Value {
    let mut features = json!({});
    for (path, on) in table {
        let mut slot = &mut features;
        let parts: Vec<&str> = path.trim_start_matches("features.").split('.').collect();
        for part in &parts[..parts.len() - 1] {
            slot = slot
                .as_object_mut()
                .unwrap()
                .entry(part.to_string())
                .or_insert_with(|| json!({}));
        }
        slot[parts[parts.len() - 1]] = json!(on);
    }
    features
}

/// The same as TOML inline tables, for `[providers.capabilities.features]`.
fn features_toml(table: &[(&'static str, bool); 12]) -> String {
    fn inline(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let fields: Vec<String> = map
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", inline(v)))
                    .collect();
                format!("{{ {} }}", fields.join(", "))
            }
            other => other.to_string(),
        }
    }
    let features = features_json(table);
    features
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k} = {}\n", inline(v)))
        .collect()
}

fn key_file(keys: &Path, name: &str, key: &str) -> String {
    let path = keys.join(format!("{name}.key"));
    std::fs::write(&path, key).unwrap();
    path.display().to_string()
}

/// The gateway's configuration for `case`: one pool `caps` whose provider declares exactly
/// the kind's table.
fn topology(case: &Case, fake: Option<&dyn Fake>, keys: &Path, local: &Path) -> String {
    let features = features_toml(&declared(case.kind));
    let kind = case.kind;
    match fake {
        None => format!(
            r#"
[local]
dir = "{dir}/sandboxes"
snapshot_dir = "{dir}/snapshots"
netns_prefix = "sgc-"
cgroup = "sandgate-capstest"
[[providers]]
name = "local"
[providers.capabilities.features]
{features}
[[accounts]]
name = "caps-acct"
provider = "local"
[[pools]]
name = "caps"
provider = "local"
account = "caps-acct"
"#,
            dir = local.display(),
        ),
        Some(fake) => format!(
            r#"
[[providers]]
name = "{kind}"
[providers.capabilities.features]
{features}
[[accounts]]
name = "caps-acct"
provider = "{kind}"
{account}
[[pools]]
name = "caps"
provider = "{kind}"
account = "caps-acct"
"#,
            account = fake.account(keys),
        ),
    }
}

// ----------------------------------------------------------------------------- fakes

/// The local provider has no fake: its instances are this machine's namespaces.
struct NoFake;

impl Fake for NoFake {
    fn account(&self, _: &Path) -> String {
        String::new()
    }
    fn effects(&self, _: &str) -> String {
        String::new()
    }
    fn state(&self, _: &str) -> String {
        String::new()
    }
}

/// The mutating requests a fake logged (reads change nothing).
macro_rules! mutations {
    ($requests:expr) => {
        $requests
            .into_iter()
            .filter(|r| r.method != "GET" && r.method != "HEAD")
            .map(|r| format!("{} {}", r.method, r.path))
            .collect::<Vec<_>>()
            .join("\n")
    };
}

fn start_e2b() -> Starting {
    Box::pin(async { Box::new(FakeE2b::start(FakeE2bConfig::default()).await) as Box<dyn Fake> })
}

impl Fake for FakeE2b {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeE2b::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{url}\"\napi_key_file = {key:?}\noptions = {{ sandbox_url = \"{url}\" }}\n",
            url = self.url(),
            key = key_file(keys, "e2b", self.api_key()),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.state))
    }
}

fn start_daytona() -> Starting {
    Box::pin(async {
        // A VM class: Daytona pauses those only (containers it can stop, not pause).
        let config = FakeDaytonaConfig {
            sandbox_class: "linux-vm".into(),
            ..FakeDaytonaConfig::default()
        };
        Box::new(FakeDaytona::start(config).await) as Box<dyn Fake>
    })
}

impl Fake for FakeDaytona {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeDaytona::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\n",
            self.api_url(),
            key_file(keys, "daytona", self.api_key()),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.state))
    }
}

fn start_vercel() -> Starting {
    Box::pin(async {
        Box::new(FakeVercel::start(FakeVercelConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakeVercel {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeVercel::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\noptions = {{ team_id = \"{}\", project_id = \"{}\" }}\n",
            self.url(),
            key_file(keys, "vercel", self.token()),
            self.team_id(),
            self.project_id(),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.status))
    }
}

fn start_runloop() -> Starting {
    Box::pin(async {
        Box::new(FakeRunloop::start(FakeRunloopConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakeRunloop {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeRunloop::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\n",
            self.url(),
            key_file(keys, "runloop", self.api_key()),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.devbox(instance).map(|s| s.status))
    }
}

fn start_prime() -> Starting {
    Box::pin(async {
        Box::new(FakePrime::start(FakePrimeConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakePrime {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakePrime::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\n",
            self.url(),
            key_file(keys, "prime", self.api_key()),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.status))
    }
}

fn start_blaxel() -> Starting {
    Box::pin(async {
        Box::new(FakeBlaxel::start(FakeBlaxelConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakeBlaxel {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeBlaxel::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\noptions = {{ workspace = \"{}\" }}\n",
            self.url(),
            key_file(keys, "blaxel", self.api_key()),
            self.workspace(),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.status))
    }
}

fn start_cloudflare() -> Starting {
    Box::pin(async { Box::new(FakeCloudflare::start().await) as Box<dyn Fake> })
}

impl Fake for FakeCloudflare {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeCloudflare::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\n",
            self.url(),
            key_file(keys, "cloudflare", self.token()),
        )
    }
    /// The fake logs no requests: its files and state are what an operation would change.
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{:?}", self.state(instance), self.files(instance))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.state()))
    }
}

fn start_modal() -> Starting {
    Box::pin(async {
        Box::new(FakeModal::start(FakeModalConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakeModal {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeModal::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        let key = format!("{}:{}", self.token_id(), self.token_secret());
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\noptions = {{ image_id = \"{BASE_IMAGE}\" }}\n",
            self.url(),
            key_file(keys, "modal", &key),
        )
    }
    /// The fake logs no requests: the commands it ran and the instance's state are what an
    /// operation would change (Modal's files go through commands).
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{:?}", self.state(instance), self.commands())
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.state))
    }
}

fn start_northflank() -> Starting {
    Box::pin(async {
        Box::new(FakeNorthflank::start(FakeNorthflankConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakeNorthflank {
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\noptions = {{ project = \"{}\" }}\n",
            self.url(),
            key_file(keys, "northflank", self.token()),
            self.project(),
        )
    }
    fn effects(&self, instance: &str) -> String {
        let files = self.service(instance).map(|s| s.files.len());
        format!(
            "{} {files:?}\n{}",
            self.state(instance),
            mutations!(self.requests())
        )
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.service(instance).map(|s| s.paused))
    }
}

fn start_freestyle() -> Starting {
    Box::pin(async {
        Box::new(FakeFreestyle::start(FakeFreestyleConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakeFreestyle {
    fn file(&self, instance: &str, path: &str) -> Result<Option<Vec<u8>>, ()> {
        Ok(FakeFreestyle::file(self, instance, path))
    }
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\n",
            self.url(),
            key_file(keys, "freestyle", self.api_key()),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.vm(instance).map(|s| s.state))
    }
}

fn start_codesandbox() -> Starting {
    Box::pin(async {
        Box::new(FakeCodesandbox::start(FakeCodesandboxConfig::default()).await) as Box<dyn Fake>
    })
}

impl Fake for FakeCodesandbox {
    fn account(&self, keys: &Path) -> String {
        format!(
            "base_url = \"{}\"\napi_key_file = {:?}\noptions = {{ tier = \"Nano\" }}\n",
            self.url(),
            key_file(keys, "codesandbox", self.api_key()),
        )
    }
    fn effects(&self, instance: &str) -> String {
        format!("{}\n{}", self.state(instance), mutations!(self.requests()))
    }
    fn state(&self, instance: &str) -> String {
        format!("{:?}", self.sandbox(instance).map(|s| s.vm))
    }
}

// ------------------------------------------------------------------------------ test

/// One case's gateway, sandbox and fake.
struct Env {
    case: &'static str,
    gw: Gateway,
    fake: Box<dyn Fake>,
    http: reqwest::Client,
    id: String,
    instance: String,
    table: [(&'static str, bool); 12],
    home: &'static str,
    /// Whether the kind is hosted (has a fake).
    hosted: bool,
    _keys: tempfile::TempDir,
}

async fn run(case: &Case) {
    if case.start.is_none() && !root_or_skip(&format!("capabilities::{}", case.kind)) {
        return;
    }
    let env = Env::start(case).await;
    env.pools_view().await;
    env.execute().await;
    env.exec_user().await;
    env.ordered_output().await;
    env.cancel().await;
    env.facade_kill().await;
    env.files().await;
    env.pause_resume().await;
}

impl Env {
    async fn start(case: &Case) -> Env {
        init();
        let fake: Box<dyn Fake> = match case.start {
            Some(start) => start().await,
            None => Box::new(NoFake),
        };
        let keys = tempfile::tempdir().unwrap();
        let hosted = case.start.is_some();
        let topology = topology(
            case,
            hosted.then_some(fake.as_ref()),
            keys.path(),
            keys.path(),
        );
        let gw = Gateway::start(GatewayOptions {
            identities: vec![],
            // Hosted sandboxes are given the proxy's public address (not dialled here).
            proxy_toml: if hosted {
                "public_url = \"http://127.0.0.1:3999\"\n".into()
            } else {
                String::new()
            },
            extra_toml: format!(
                r#"
[[api.tokens]]
token = "{API_TOKEN}"
principal = "alice"
workspace = "ws-a"
[e2b]
listen = "127.0.0.1:0"
[[e2b.api_keys]]
key = "{E2B_KEY}"
principal = "alice"
workspace = "ws-a"
{topology}
"#
            ),
            ..GatewayOptions::default()
        })
        .await;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let mut env = Env {
            case: case.kind,
            gw,
            fake,
            http,
            id: String::new(),
            instance: String::new(),
            table: declared(case.kind),
            home: case.home,
            hosted,
            _keys: keys,
        };
        env.create().await;
        env
    }

    fn has(&self, path: &str) -> bool {
        flag(&self.table, path)
    }

    fn url(&self, path: &str) -> String {
        self.gw.api(&format!("/v1/sandboxes/{}{path}", self.id))
    }

    /// Creates the sandbox on the pool, asking for every declared feature and nothing else
    /// (the baseline off where the kind has none), and waits until it runs.
    async fn create(&mut self) {
        let body = json!({
            "provider": self.case,
            "features": features_json(&self.table),
            "labels": {"test": "capabilities"},
        });
        let (status, created) = self.gw.api_post("/v1/sandboxes", API_TOKEN, &body).await;
        assert!(
            status == 201 || status == 202,
            "[{}] create: {status} {created:#}",
            self.case
        );
        self.id = created["id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + RUNNING_WITHIN;
        let view = loop {
            let view = self.view().await;
            match view["state"].as_str().unwrap_or_default() {
                "running" => break view,
                "pending" | "provisioning" | "reconciling" if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                _ => panic!("[{}] the sandbox did not run: {view:#}", self.case),
            }
        };
        assert_eq!(view["placement"]["pool"], "caps", "{view:#}");
        self.instance = view["placement"]["instance_id"]
            .as_str()
            .unwrap()
            .to_string();
    }

    async fn view(&self) -> Value {
        self.gw
            .api_json(&format!("/v1/sandboxes/{}", self.id), API_TOKEN)
            .await
    }

    /// The router's view of the pool is the kind's table, flag for flag.
    async fn pools_view(&self) {
        let pools = self.gw.api_json("/v1/pools", API_TOKEN).await;
        let pool = pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pool"] == "caps")
            .unwrap_or_else(|| panic!("no pool caps: {pools:#}"));
        let shown = &pool["capabilities"]["features"];
        let expected: serde_json::Map<String, Value> = self
            .table
            .iter()
            .map(|(path, on)| (path.trim_start_matches("features.").to_string(), json!(on)))
            .collect();
        assert_eq!(shown, &Value::Object(expected), "[{}] {pool:#}", self.case);
        // A hosted sandbox's view names its egress enforcement with the pool's own word.
        if self.hosted {
            let view = self.view().await;
            assert_eq!(
                view["egress"]["enforcement"], pool["egress"],
                "[{}] {view:#} {pool:#}",
                self.case
            );
        }
    }

    /// `status` and `body` are a 501 `unsupported` naming the provider, and the fake saw no
    /// change since `before`.
    fn assert_unsupported(&self, what: &str, status: u16, body: &Value, before: &str) {
        assert_eq!(status, 501, "[{}] {what}: {body:#}", self.case);
        assert_eq!(
            body["error"]["code"], "unsupported",
            "[{}] {what}: {body:#}",
            self.case
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(self.case),
            "[{}] {what}: the message does not name the provider: {body:#}",
            self.case
        );
        assert_eq!(
            self.fake.effects(&self.instance),
            before,
            "[{}] {what}: an unsupported operation changed the fake",
            self.case
        );
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Vec<u8>) {
        let r = request.bearer_auth(API_TOKEN).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.bytes().await.unwrap().to_vec())
    }

    async fn send_json(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let (status, bytes) = self.send(request).await;
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, body)
    }

    // ------------------------------------------------------------------- process

    /// Starts a command; its answer's status, and the stream when it started.
    async fn exec(&self, argv: &[&str]) -> Result<ExecOutput, (u16, Value)> {
        let r = self
            .http
            .post(self.url("/exec"))
            .bearer_auth(API_TOKEN)
            .json(&json!({ "argv": argv }))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        if status != 200 {
            let text = r.text().await.unwrap();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            return Err((status, body));
        }
        let mut out = ExecOutput {
            response: r,
            pending: Vec::new(),
            exec_id: String::new(),
            stdout: String::new(),
            stderr: String::new(),
            exit: None,
        };
        let started = out.next().await.expect("a started line");
        assert_eq!(started["type"], "started", "{started}");
        out.exec_id = started["exec_id"].as_str().unwrap().to_string();
        Ok(out)
    }

    async fn execute(&self) {
        let before = self.fake.effects(&self.instance);
        let result = self
            .exec(&["sh", "-c", "echo capabilities-ok; exit 7"])
            .await;
        if !self.has("process.execute") {
            let (status, body) = result.err().expect("an undeclared exec is refused");
            self.assert_unsupported("exec", status, &body, &before);
            return;
        }
        let mut out = result.unwrap_or_else(|e| panic!("[{}] exec: {e:?}", self.case));
        let exit = out.finish(EXEC_WITHIN).await;
        assert_eq!(out.stdout, "capabilities-ok\n", "[{}]", self.case);
        assert_eq!(exit["code"], 7, "[{}] {exit}", self.case);
        assert_eq!(exit["reason"], "exited", "[{}] {exit}", self.case);
    }

    /// `user` on an exec is never ignored: a hosted kind runs commands as its provider's own
    /// user and refuses any choice (501, nothing reaches the fake); the local pool, which
    /// declares only its default user here, refuses another name (400, naming `user`) and
    /// runs a command that names its default user.
    async fn exec_user(&self) {
        let before = self.fake.effects(&self.instance);
        let exec_as = |user: &'static str| {
            self.http
                .post(self.url("/exec"))
                .bearer_auth(API_TOKEN)
                .json(&json!({"argv": ["id", "-u"], "user": user}))
                .send()
        };
        let r = exec_as("root").await.unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        if self.hosted {
            self.assert_unsupported("exec as root", status, &body, &before);
            return;
        }
        assert_eq!(status, 400, "[{}] exec as root: {body:#}", self.case);
        assert_eq!(body["error"]["code"], "invalid_request", "{body:#}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("\"root\" is not declared")
                && message
                    .ends_with("declares: user ([local.users] in the gateway's configuration)"),
            "{body:#}"
        );
        let r = exec_as("user").await.unwrap();
        assert_eq!(r.status(), 200, "[{}] exec as user", self.case);
        let text = r.text().await.unwrap();
        assert!(text.contains("65534"), "[{}] {text}", self.case);
    }

    async fn ordered_output(&self) {
        if !self.has("process.ordered_output") {
            // No endpoint of its own: undeclared, commands still run (or not: `execute`).
            return;
        }
        let script =
            format!("i=1; while [ $i -le {LINES} ]; do echo line-$i; i=$((i+1)); done; exit 0");
        let mut out = self
            .exec(&["sh", "-c", &script])
            .await
            .unwrap_or_else(|e| panic!("[{}] exec: {e:?}", self.case));
        let exit = out.finish(EXEC_WITHIN).await;
        let expected: String = (1..=LINES).map(|i| format!("line-{i}\n")).collect();
        assert_eq!(exit["code"], 0, "[{}] {exit}", self.case);
        assert!(
            out.stdout == expected,
            "[{}] {LINES} lines did not come back in order: {:?}",
            self.case,
            out.stdout
        );
    }

    /// The E2B facade's `SendSignal` is a cancel too: the command is killed where the kind
    /// cancels, and refused `unimplemented` naming the provider where it cannot (never
    /// answered as done while the command goes on at the provider).
    async fn facade_kill(&self) {
        if !self.has("process.execute") {
            return;
        }
        let base = format!("http://{}", self.gw.server.e2b_addr().unwrap());
        let detail: Value = self
            .http
            .get(format!("{base}/sandboxes/{}", self.id))
            .header("X-API-Key", E2B_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = detail["envdAccessToken"].as_str().unwrap().to_string();
        let envd = |path: &str| {
            self.http
                .post(format!("{base}{path}"))
                .header("E2b-Sandbox-Id", &self.id)
                .header("X-Access-Token", &token)
        };
        // Killed: a command far longer than the wait for its end; refused: one that ends
        // on its own soon, having printed `finished`.
        let script = if self.has("process.cancel") {
            format!("echo started; sleep {LONG_COMMAND_SECS}; echo finished")
        } else {
            "echo started; sleep 2; echo finished".to_string()
        };
        let body = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
        let mut stream = envd("/process.Process/Start")
            .header("Content-Type", "application/connect+json")
            .body(sandgate::e2b::connect::envelope(&serde_json::to_vec(&body).unwrap()).to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), 200, "[{}] facade start", self.case);
        let mut decoder = sandgate::e2b::connect::Decoder::default();
        let mut events: Vec<Value> = Vec::new();
        let next = |decoder: &mut sandgate::e2b::connect::Decoder, events: &mut Vec<Value>| {
            while let Some(frame) = decoder.next_frame().unwrap() {
                events.push(serde_json::from_slice(&frame.payload).unwrap());
            }
        };
        // The facade's pid comes in the first event, `start`, once the command was started.
        let deadline = Instant::now() + EXEC_WITHIN;
        while events.is_empty() {
            let chunk = tokio::time::timeout_at(deadline.into(), stream.chunk())
                .await
                .unwrap_or_else(|_| panic!("[{}] no start event", self.case))
                .unwrap()
                .unwrap_or_else(|| panic!("[{}] the stream ended unstarted", self.case));
            decoder.push(&chunk);
            next(&mut decoder, &mut events);
        }
        let deadline = Instant::now() + CANCELLED_WITHIN;
        let pid = events[0]["event"]["start"]["pid"].as_u64().unwrap();
        let r = envd("/process.Process/SendSignal")
            .json(&json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.json().await.unwrap();
        while let Some(chunk) = tokio::time::timeout_at(deadline.into(), stream.chunk())
            .await
            .unwrap_or_else(|_| panic!("[{}] the stream did not end: {events:?}", self.case))
            .unwrap()
        {
            decoder.push(&chunk);
            next(&mut decoder, &mut events);
        }
        // stdout travels base64-encoded per chunk, so decode before looking for the word.
        let stdout: Vec<u8> = events
            .iter()
            .filter_map(|e| e["event"]["data"]["stdout"].as_str())
            .flat_map(|b| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .unwrap_or_else(|e| panic!("[{}] stdout not base64: {e}", self.case))
            })
            .collect();
        let printed_finished = String::from_utf8_lossy(&stdout).contains("finished");
        if self.has("process.cancel") {
            assert_eq!(status, 200, "[{}] facade kill: {answer}", self.case);
            assert!(
                !printed_finished,
                "[{}] killed, yet it finished: {events:?}",
                self.case
            );
        } else {
            assert_eq!(status, 501, "[{}] facade kill: {answer}", self.case);
            assert_eq!(answer["code"], "unimplemented", "[{}] {answer}", self.case);
            assert!(
                answer["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(self.case),
                "[{}] the refusal does not name the provider: {answer}",
                self.case
            );
            assert!(
                printed_finished,
                "[{}] refused, yet it ended early: {events:?}",
                self.case
            );
        }
    }

    async fn cancel(&self) {
        let cancel_url = |exec_id: &str| self.url(&format!("/exec/{exec_id}/cancel"));
        if !self.has("process.execute") {
            // Nothing can run, so there is no command to cancel: still refused as such.
            let before = self.fake.effects(&self.instance);
            let (status, body) = self
                .send_json(self.http.post(cancel_url("ex-0000000000000000")))
                .await;
            self.assert_unsupported("exec cancel", status, &body, &before);
            return;
        }
        if !self.has("process.cancel") {
            // Refused, and the command goes on to its own end.
            let mut out = self
                .exec(&["sh", "-c", "echo started; sleep 1; echo finished"])
                .await
                .unwrap_or_else(|e| panic!("[{}] exec: {e:?}", self.case));
            out.wait_stdout("started\n", EXEC_WITHIN).await;
            let before = self.fake.effects(&self.instance);
            let (status, body) = self
                .send_json(self.http.post(cancel_url(&out.exec_id)))
                .await;
            self.assert_unsupported("exec cancel", status, &body, &before);
            let exit = out.finish(EXEC_WITHIN).await;
            assert_eq!(out.stdout, "started\nfinished\n", "[{}]", self.case);
            assert_eq!(exit["reason"], "exited", "[{}] {exit}", self.case);
            return;
        }
        // The shell records its pid (in its working directory, the home) so that this test
        // can see the command end at the fake, not only its stream.
        let script =
            format!("echo $$ > sgcaps.pid; echo started; sleep {LONG_COMMAND_SECS}; echo finished");
        let mut out = self
            .exec(&["sh", "-c", &script])
            .await
            .unwrap_or_else(|e| panic!("[{}] exec: {e:?}", self.case));
        // Cancel once the command surely runs: its pid is written. (Daytona's execute
        // answers only when the command ends, so its output cannot tell.)
        let pid = self.pid_file("sgcaps.pid").await;
        let asked = Instant::now();
        let (status, body) = self
            .send_json(self.http.post(cancel_url(&out.exec_id)))
            .await;
        assert_eq!(status, 202, "[{}] cancel: {body:#}", self.case);
        let exit = out.finish(CANCELLED_WITHIN).await;
        assert!(asked.elapsed() < CANCELLED_WITHIN, "[{}]", self.case);
        assert_eq!(exit["reason"], "cancelled", "[{}] {exit}", self.case);
        assert!(!out.stdout.contains("finished"), "[{}]", self.case);
        // A fake runs commands as this machine's processes: the command itself has ended.
        // (A local sandbox's pid is its own namespace's; `local_provider` covers its kill.)
        if self.hosted {
            let deadline = asked + CANCELLED_WITHIN;
            while alive(pid) {
                assert!(
                    Instant::now() < deadline,
                    "[{}] the cancelled command (pid {pid}) still runs at the fake: {}",
                    self.case,
                    self.fake.effects(&self.instance)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// The pid a command wrote to `name` in the home, once it has (read through the API).
    async fn pid_file(&self, name: &str) -> u32 {
        let deadline = Instant::now() + EXEC_WITHIN;
        loop {
            let (status, bytes) = self.read(&self.path(name)).await;
            let text = String::from_utf8_lossy(&bytes);
            if status == 200 && text.ends_with('\n') {
                return text.trim().parse().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "[{}] the command wrote no pid: {status} {text}",
                self.case
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // --------------------------------------------------------------------- files

    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.home)
    }

    async fn read(&self, path: &str) -> (u16, Vec<u8>) {
        self.send(
            self.http
                .get(self.url("/files/content"))
                .query(&[("path", path)]),
        )
        .await
    }

    async fn list(&self, path: &str) -> (u16, Value) {
        self.send_json(self.http.get(self.url("/files")).query(&[("path", path)]))
            .await
    }

    /// Whether `name` is listed in the home directory, as `kind`.
    async fn listed(&self, name: &str, kind: &str) -> bool {
        let (status, listing) = self.list(self.home).await;
        assert_eq!(status, 200, "[{}] list: {listing:#}", self.case);
        listing["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == name && e["kind"] == kind)
    }

    /// What the file test writes: every byte value, so that nothing on the way treats the
    /// file as text.
    fn data(&self) -> Vec<u8> {
        (0..=255u8)
            .chain(b"capabilities\n".iter().copied())
            .collect()
    }

    /// The fake holds `expected` at `path` (`None`: no such file), where it can be seen.
    fn assert_at_fake(&self, path: &str, expected: Option<&Vec<u8>>, when: &str) {
        if let Ok(held) = self.fake.file(&self.instance, path) {
            assert_eq!(
                held.as_ref(),
                expected,
                "[{}] {path} at the fake {when}",
                self.case
            );
        }
    }

    async fn files(&self) {
        let data = self.data();
        let file = self.path("sgcaps-data.bin");

        let before = self.fake.effects(&self.instance);
        let write = self.http.put(self.url("/files/content"));
        let (status, body) = self
            .send_json(write.query(&[("path", &file)]).body(data.clone()))
            .await;
        if self.has("filesystem.write") {
            assert_eq!(status, 204, "[{}] write: {body:#}", self.case);
            self.assert_at_fake(&file, Some(&data), "after the write");
        } else {
            self.assert_unsupported("files write", status, &body, &before);
            self.assert_at_fake(&file, None, "after a refused write");
        }

        let before = self.fake.effects(&self.instance);
        let (status, bytes) = self.read(&file).await;
        if self.has("filesystem.read") {
            assert_eq!(status, 200, "[{}] read: {:?}", self.case, bytes);
            assert_eq!(bytes, data, "[{}] read back other bytes", self.case);
        } else {
            let body = serde_json::from_slice(&bytes).unwrap();
            self.assert_unsupported("files read", status, &body, &before);
        }

        let before = self.fake.effects(&self.instance);
        if self.has("filesystem.list") {
            assert!(
                self.listed("sgcaps-data.bin", "file").await,
                "[{}] the written file is not listed",
                self.case
            );
        } else {
            let (status, body) = self.list(self.home).await;
            self.assert_unsupported("files list", status, &body, &before);
        }

        self.mkdir().await;
        self.delete(&file).await;
    }

    async fn mkdir(&self) {
        let dir = self.path("sgcaps-dir/inner");
        let before = self.fake.effects(&self.instance);
        let (status, body) = self
            .send_json(
                self.http
                    .post(self.url("/files/mkdir"))
                    .query(&[("path", dir.as_str()), ("parents", "true")]),
            )
            .await;
        if !self.has("filesystem.mkdir") {
            self.assert_unsupported("files mkdir", status, &body, &before);
            return;
        }
        assert_eq!(status, 201, "[{}] mkdir: {body:#}", self.case);
        if self.has("filesystem.list") {
            assert!(
                self.listed("sgcaps-dir", "dir").await,
                "[{}] the directory is not listed",
                self.case
            );
            let (status, listing) = self.list(&self.path("sgcaps-dir")).await;
            assert_eq!(status, 200, "[{}] {listing:#}", self.case);
            assert_eq!(
                listing["entries"][0]["name"], "inner",
                "[{}] {listing:#}",
                self.case
            );
        } else {
            // No listing: the directory is seen by a command instead (the path a whole
            // argument: fakes map sandbox paths in arguments that start with one).
            let mut out = self
                .exec(&["test", "-d", &dir])
                .await
                .unwrap_or_else(|e| panic!("[{}] exec: {e:?}", self.case));
            let exit = out.finish(EXEC_WITHIN).await;
            assert_eq!(exit["code"], 0, "[{}] no directory {dir}", self.case);
        }
    }

    async fn delete(&self, file: &str) {
        let before = self.fake.effects(&self.instance);
        let (status, body) = self
            .send_json(
                self.http
                    .delete(self.url("/files"))
                    .query(&[("path", file)]),
            )
            .await;
        if !self.has("filesystem.delete") {
            self.assert_unsupported("files delete", status, &body, &before);
            if self.has("filesystem.write") {
                self.assert_at_fake(file, Some(&self.data()), "after a refused delete");
            }
            if self.has("filesystem.read") {
                assert_eq!(self.read(file).await.0, 200, "[{}] still there", self.case);
            }
            return;
        }
        assert_eq!(status, 204, "[{}] delete: {body:#}", self.case);
        self.assert_at_fake(file, None, "after the delete");
        let (status, bytes) = self.read(file).await;
        assert_eq!(
            status,
            404,
            "[{}] read after delete: {}",
            self.case,
            String::from_utf8_lossy(&bytes)
        );
        if self.has("filesystem.list") {
            assert!(
                !self.listed("sgcaps-data.bin", "file").await,
                "[{}] the deleted file is still listed",
                self.case
            );
        }
    }

    // ----------------------------------------------------------------- lifecycle

    async fn lifecycle(&self, op: &str) -> (u16, Value) {
        self.send_json(self.http.post(self.url(&format!("/{op}"))))
            .await
    }

    async fn pause_resume(&self) {
        let before = self.fake.effects(&self.instance);
        let running = self.fake.state(&self.instance);
        let (status, body) = self.lifecycle("pause").await;
        if !self.has("pause_resume") {
            // (A resume of a running sandbox is refused by its state, 409, before any
            // provider is asked: only the pause can show the capability missing.)
            self.assert_unsupported("pause", status, &body, &before);
            assert_eq!(self.view().await["state"], "running", "[{}]", self.case);
            return;
        }
        assert_eq!(status, 200, "[{}] pause: {body:#}", self.case);
        assert_eq!(body["state"], "paused", "[{}] {body:#}", self.case);
        // (The local provider has no fake to ask: a command after the resume shows it.)
        if self.hosted {
            assert_ne!(
                self.fake.state(&self.instance),
                running,
                "[{}] the fake's instance was not paused",
                self.case
            );
        }
        let (status, body) = self.lifecycle("resume").await;
        assert_eq!(status, 200, "[{}] resume: {body:#}", self.case);
        assert_eq!(body["state"], "running", "[{}] {body:#}", self.case);
        assert_eq!(
            self.fake.state(&self.instance),
            running,
            "[{}] the fake's instance is not running again",
            self.case
        );
        if self.has("process.execute") {
            let mut out = self
                .exec(&["sh", "-c", "echo resumed"])
                .await
                .unwrap_or_else(|e| panic!("[{}] exec after resume: {e:?}", self.case));
            out.finish(EXEC_WITHIN).await;
            assert_eq!(out.stdout, "resumed\n", "[{}]", self.case);
        }
    }
}

/// A running exec's NDJSON stream, read as it comes.
struct ExecOutput {
    response: reqwest::Response,
    pending: Vec<u8>,
    exec_id: String,
    stdout: String,
    stderr: String,
    exit: Option<Value>,
}

impl ExecOutput {
    /// The next line, or `None` when the stream ended.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            match self.response.chunk().await.unwrap() {
                Some(chunk) => self.pending.extend_from_slice(&chunk),
                None => return None,
            }
        }
    }

    /// Takes in one line; `false` when the stream ended.
    async fn step(&mut self) -> bool {
        let Some(line) = self.next().await else {
            return false;
        };
        match line["type"].as_str() {
            Some("stdout") => self.stdout.push_str(line["text"].as_str().unwrap()),
            Some("stderr") => self.stderr.push_str(line["text"].as_str().unwrap()),
            Some("exit") => self.exit = Some(line),
            _ => panic!("unexpected line {line}"),
        }
        true
    }

    /// Reads until stdout holds `text`, within `within`.
    async fn wait_stdout(&mut self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.stdout.contains(text) {
            let step = tokio::time::timeout_at(deadline.into(), self.step()).await;
            assert!(
                matches!(step, Ok(true)),
                "no {text:?} on stdout: {:?} {:?}",
                self.stdout,
                self.stderr
            );
        }
    }

    /// Reads to the end of the stream, within `within`: its `exit` line.
    async fn finish(&mut self, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline.into(), self.step()).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => panic!(
                    "the command did not end in time: {:?} {:?}",
                    self.stdout, self.stderr
                ),
            }
        }
        self.exit
            .clone()
            .unwrap_or_else(|| panic!("no exit line: {:?} {:?}", self.stdout, self.stderr))
    }
}

/// Whether process `pid` of this machine still runs (a zombie has ended: only its parent's
/// wait is missing).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}
