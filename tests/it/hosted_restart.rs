//! Process-level, on hosted pools: `kill -9` the real `sandgate` binary while a create is in
//! flight at a provider's fake (the instance exists there and is still booting) and start it
//! again on the same configuration and SQLite state. The create must resume and end with
//! exactly one live instance across every fake of the test, the one made before the crash,
//! found by its tags and adopted (finished with sandgate's CA), never a second one. The same
//! holds for a gateway paused (`SIGSTOP`) past the create's lease while it drives it.
//!
//! Table-driven: [`CASES`] has one entry per provider kind, each starting its fake (from
//! `tests/it/common/fakes`) and describing it through [`HostedFake`]: the topology of one
//! pool on it, its live instances with their sandbox tag. Adding a provider is one more
//! entry; every test runs every entry.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::fakes::blaxel::{FakeBlaxel, FakeBlaxelConfig, SandboxStatus};
use crate::common::fakes::cloudflare::{FakeCloudflare, FakeCloudflareConfig};
use crate::common::fakes::modal::{FakeModal, FakeModalConfig, BASE_IMAGE};
use crate::common::fakes::prime::{FakePrime, FakePrimeConfig};
use crate::common::{init, process_config, serve_process, Served};

const API_TOKEN: &str = "api-token-hosted-restart-0123456789";
/// The tag every instance carries with its sandbox's id.
const SANDBOX_TAG: &str = "sandgate_sandbox";
/// Generous bounds for a loaded 2-core machine: each is a deadline for polling, never a
/// sleep the outcome depends on.
const SEEN_WITHIN: Duration = Duration::from_secs(30);
const RUNNING_WITHIN: Duration = Duration::from_secs(90);

/// One live instance at a fake.
#[derive(Debug, Clone)]
struct Live {
    id: String,
    /// The value of its [`SANDBOX_TAG`].
    sandbox: Option<String>,
    /// Made, not running yet.
    booting: bool,
}

/// A hosted provider's fake, as these tests drive it.
trait HostedFake: Send + Sync {
    /// `[[providers]]`, `[[accounts]]` and `[[pools]]` for one pool named `pool` on this
    /// fake (the provider named as its kind); key files are written under `keys`.
    fn topology(&self, pool: &str, keys: &Path) -> String;
    /// Every live instance at the fake, whatever its tags.
    fn live(&self) -> Vec<Live>;
    /// How many create requests reached the fake.
    fn creates(&self) -> usize;
    /// The CA file the adapter installs in an instance (at its `CA_PATH`).
    fn ca(&self, instance: &str) -> Option<Vec<u8>>;
}

type Starting = Pin<Box<dyn Future<Output = Box<dyn HostedFake>> + Send>>;

/// One provider kind.
struct Case {
    /// The `[[providers]]` name (its kind) and the view's `placement.provider`.
    kind: &'static str,
    /// Starts its fake, a new instance taking the given time to run.
    start: fn(Duration) -> Starting,
}

/// Every hosted provider these tests cover, one entry each.
const CASES: &[Case] = &[
    Case {
        kind: "prime-intellect",
        start: start_prime,
    },
    Case {
        kind: "blaxel",
        start: start_blaxel,
    },
    Case {
        kind: "cloudflare",
        start: start_cloudflare,
    },
    Case {
        kind: "modal",
        start: start_modal,
    },
];

fn key_file(keys: &Path, name: &str, key: &str) -> String {
    let path = keys.join(format!("{name}.key"));
    std::fs::write(&path, key).unwrap();
    path.display().to_string()
}

/// One account `<pool>-acct` and one pool, on a provider named `kind`.
fn one_pool(kind: &str, pool: &str, base_url: &str, key: &str, options: &str) -> String {
    format!(
        r#"
[[providers]]
name = "{kind}"
[[accounts]]
name = "{pool}-acct"
provider = "{kind}"
base_url = "{base_url}"
api_key_file = {key:?}
{options}
[[pools]]
name = "{pool}"
provider = "{kind}"
account = "{pool}-acct"
"#
    )
}

fn start_prime(boot: Duration) -> Starting {
    Box::pin(async move {
        let fake = FakePrime::start(FakePrimeConfig {
            boot_delay: boot,
            ..FakePrimeConfig::default()
        })
        .await;
        Box::new(fake) as Box<dyn HostedFake>
    })
}

impl HostedFake for FakePrime {
    fn topology(&self, pool: &str, keys: &Path) -> String {
        let key = key_file(keys, pool, self.api_key());
        one_pool("prime-intellect", pool, &self.url(), &key, "")
    }

    fn live(&self) -> Vec<Live> {
        let prefix = format!("{SANDBOX_TAG}=");
        FakePrime::live(self)
            .into_iter()
            .map(|s| Live {
                sandbox: s
                    .labels
                    .iter()
                    .find_map(|l| l.strip_prefix(&prefix).map(str::to_string)),
                booting: s.status != "RUNNING",
                id: s.id,
            })
            .collect()
    }

    fn creates(&self) -> usize {
        self.create_log().len()
    }

    fn ca(&self, instance: &str) -> Option<Vec<u8>> {
        self.file(instance, sandgate::providers::prime::CA_PATH)
    }
}

fn start_blaxel(boot: Duration) -> Starting {
    Box::pin(async move {
        let fake = FakeBlaxel::start(FakeBlaxelConfig {
            boot_delay: boot,
            ..FakeBlaxelConfig::default()
        })
        .await;
        Box::new(fake) as Box<dyn HostedFake>
    })
}

impl HostedFake for FakeBlaxel {
    fn topology(&self, pool: &str, keys: &Path) -> String {
        let key = key_file(keys, pool, self.api_key());
        let options = format!("options = {{ workspace = \"{}\" }}", self.workspace());
        one_pool("blaxel", pool, &self.url(), &key, &options)
    }

    fn live(&self) -> Vec<Live> {
        FakeBlaxel::live(self)
            .into_iter()
            .map(|s| Live {
                sandbox: s.labels.get(SANDBOX_TAG).cloned(),
                booting: s.status == SandboxStatus::Deploying,
                id: s.name,
            })
            .collect()
    }

    fn creates(&self) -> usize {
        self.create_log().len()
    }

    fn ca(&self, instance: &str) -> Option<Vec<u8>> {
        self.file(instance, sandgate::providers::blaxel::CA_PATH)
    }
}

fn start_modal(boot: Duration) -> Starting {
    Box::pin(async move {
        let fake = FakeModal::start(FakeModalConfig {
            boot_delay: boot,
            ..FakeModalConfig::default()
        })
        .await;
        Box::new(fake) as Box<dyn HostedFake>
    })
}

impl HostedFake for FakeModal {
    fn topology(&self, pool: &str, keys: &Path) -> String {
        let key = format!("{}:{}", self.token_id(), self.token_secret());
        let key = key_file(keys, pool, &key);
        let options = format!("options = {{ image_id = \"{BASE_IMAGE}\" }}");
        one_pool("modal", pool, &self.url(), &key, &options)
    }

    fn live(&self) -> Vec<Live> {
        FakeModal::live(self)
            .into_iter()
            .map(|s| Live {
                sandbox: s.tags.get(SANDBOX_TAG).cloned(),
                booting: s.state == "pending",
                id: s.id,
            })
            .collect()
    }

    fn creates(&self) -> usize {
        self.create_log().len()
    }

    fn ca(&self, instance: &str) -> Option<Vec<u8>> {
        self.file(instance, sandgate::providers::hosted::modal::CA_PATH)
    }
}

fn start_cloudflare(boot: Duration) -> Starting {
    Box::pin(async move {
        let fake = FakeCloudflare::start_with(FakeCloudflareConfig { start_delay: boot }).await;
        Box::new(fake) as Box<dyn HostedFake>
    })
}

impl HostedFake for FakeCloudflare {
    fn topology(&self, pool: &str, keys: &Path) -> String {
        let key = key_file(keys, pool, self.token());
        one_pool("cloudflare", pool, &self.url(), &key, "")
    }

    fn live(&self) -> Vec<Live> {
        FakeCloudflare::live(self)
            .into_iter()
            .map(|s| Live {
                sandbox: s.labels.get(SANDBOX_TAG).cloned(),
                booting: s.state() != "running",
                id: s.id,
            })
            .collect()
    }

    fn creates(&self) -> usize {
        FakeCloudflare::creates(self)
    }

    fn ca(&self, instance: &str) -> Option<Vec<u8>> {
        self.file(instance, sandgate::providers::cloudflare::CA_PATH)
    }
}

/// The fakes of one test, each with its pool (in the configured order) and kind.
struct Fakes(Vec<(String, &'static str, Box<dyn HostedFake>)>);

impl Fakes {
    /// Every live instance at every fake, with the pool it is on.
    fn live(&self) -> Vec<(String, Live)> {
        self.0
            .iter()
            .flat_map(|(pool, _, fake)| fake.live().into_iter().map(|l| (pool.clone(), l)))
            .collect()
    }
}

fn serve(config: &Path) -> Served {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "info");
    serve_process(command)
}

fn log(served: &Served) -> String {
    served
        .stderr
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .join("\n")
}

/// What happens to the gateway while the first pool's instance boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interruption {
    /// `kill -9`, then a new process on the same configuration and state.
    Kill9AndRestart,
    /// `SIGSTOP` for longer than the create's lease, then `SIGCONT`, a few times: the
    /// process's own janitor finds the lease expired and claims the create it is driving.
    PausedPastTheLease,
}

/// The create's lease: short, so that a restart takes over soon and a pause outlives it.
const LEASE: Duration = Duration::from_millis(1000);
/// One pause of [`Interruption::PausedPastTheLease`], and how many.
const PAUSE: Duration = Duration::from_millis(1500);
const PAUSES: usize = 3;

impl Interruption {
    /// How long a new instance takes to run: the interruption ends well within it.
    fn boot(self) -> Duration {
        match self {
            Interruption::Kill9AndRestart => Duration::from_secs(4),
            Interruption::PausedPastTheLease => Duration::from_secs(8),
        }
    }
}

fn signal(served: &Served, signal: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    let rc = unsafe { libc::kill(served.child.id() as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill({signal})");
}

/// The scenario on `cases`' fakes, one pool each in that order (the first is tried first):
/// create, interrupt the gateway while the first fake's instance boots, then running, with
/// one live instance across every fake.
async fn interrupt_mid_create(cases: &[&Case], interruption: Interruption) {
    init();
    let kinds = cases.iter().map(|c| c.kind).collect::<Vec<_>>().join(",");
    let label = format!("{interruption:?} on {kinds}");
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let mut fakes = Fakes(Vec::new());
    for (i, case) in cases.iter().enumerate() {
        let pool = format!("p{}-{}", i + 1, case.kind);
        let fake = (case.start)(interruption.boot()).await;
        fakes.0.push((pool, case.kind, fake));
    }
    let topology: String = fakes
        .0
        .iter()
        .map(|(pool, _, fake)| fake.topology(pool, &keys))
        .collect();
    // The provisioning window outlives the boot and the interruption together.
    let extra = format!(
        r#"
[[api.tokens]]
token = "{API_TOKEN}"
principal = "alice"
workspace = "ws-a"
[create]
short_wait_ms = 100
lease_ttl_ms = {lease}
janitor_interval_ms = 100
provisioning_window_ms = 60000
{topology}
"#,
        lease = LEASE.as_millis(),
    );
    // Hosted sandboxes are given the proxy's public address (not dialled here) and the CA.
    let proxy = "public_url = \"http://127.0.0.1:3999\"";
    let config = dir.path().join("sandgate.toml");
    std::fs::write(&config, process_config(dir.path(), proxy, "", &extra)).unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let body = json!({"labels": {"run": "hosted-restart"}});
    let idempotency_key = format!("hosted-restart-{kinds}");

    let mut first = serve(&config);
    let r = http
        .post(format!("http://{}/v1/sandboxes", first.api))
        .bearer_auth(API_TOKEN)
        .header("idempotency-key", &idempotency_key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let created: Value = r.json().await.unwrap();
    assert_eq!(status, 202, "[{label}] {created:#}");
    let id = created["id"].as_str().unwrap().to_string();
    let (first_pool, _, first_fake) = &fakes.0[0];

    // The first pool's fake has made the instance and it is still booting: interrupt now.
    let deadline = Instant::now() + SEEN_WITHIN;
    let made = loop {
        let mine: Vec<Live> = first_fake
            .live()
            .into_iter()
            .filter(|l| l.sandbox.as_deref() == Some(id.as_str()))
            .collect();
        if !mine.is_empty() {
            break mine;
        }
        assert!(
            Instant::now() < deadline,
            "[{label}] the create did not reach {first_pool}\n{}",
            log(&first)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (gateway, first_log) = match interruption {
        Interruption::Kill9AndRestart => {
            first.child.kill().unwrap(); // SIGKILL
            first.child.wait().unwrap();
            let first_log = log(&first);
            drop(first);
            (serve(&config), Some(first_log))
        }
        Interruption::PausedPastTheLease => {
            for _ in 0..PAUSES {
                signal(&first, libc::SIGSTOP);
                tokio::time::sleep(PAUSE).await;
                signal(&first, libc::SIGCONT);
                // Long enough for the janitor and the heartbeat to run once each.
                tokio::time::sleep(LEASE / 3).await;
            }
            (first, None)
        }
    };
    assert_eq!(made.len(), 1, "[{label}] {made:?}");
    assert!(
        made[0].booting,
        "[{label}] the instance was running before the interruption: {made:?}"
    );
    let made = made[0].id.clone();

    let url = format!("http://{}/v1/sandboxes/{id}", gateway.api);
    let deadline = Instant::now() + RUNNING_WITHIN;
    let view = loop {
        let r = http.get(&url).bearer_auth(API_TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 200, "[{label}] the sandbox record was lost");
        let view: Value = r.json().await.unwrap();
        let placing = ["pending", "provisioning", "reconciling"]
            .contains(&view["state"].as_str().unwrap_or_default());
        if !placing || Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let gateway_log = log(&gateway);
    let logs = match &first_log {
        Some(first) => format!("--- first run ---\n{first}\n--- second run ---\n{gateway_log}"),
        None => format!("--- gateway ---\n{gateway_log}"),
    };
    assert_eq!(view["state"], "running", "[{label}] {view:#}\n{logs}");
    let took_over = gateway_log
        .lines()
        .filter(|l| l.contains("resuming an in-flight create") && l.contains(&id))
        .count();
    match interruption {
        Interruption::Kill9AndRestart => assert!(
            took_over > 0,
            "[{label}] the create was not resumed by the new process\n{logs}"
        ),
        // Whether the janitor or the heartbeat runs first after a pause is the scheduler's
        // choice: how often the process claimed its own create is reported, not required.
        Interruption::PausedPastTheLease => {
            println!("[{label}] the process claimed its own create {took_over} time(s)")
        }
    }

    // Exactly one live instance across every fake: the one made before the interruption,
    // on the first pool, placed.
    let live = fakes.live();
    assert_eq!(live.len(), 1, "[{label}] {live:?}\n{view:#}");
    let (pool, instance) = &live[0];
    assert_eq!(pool, first_pool, "[{label}] {live:?}");
    assert_eq!(instance.sandbox.as_deref(), Some(id.as_str()), "{live:?}");
    assert_eq!(instance.id, made, "[{label}] not the instance made before");
    assert_eq!(view["placement"]["pool"], first_pool.as_str(), "{view:#}");
    assert_eq!(view["placement"]["provider"], cases[0].kind, "{view:#}");
    assert_eq!(
        view["placement"]["instance_id"],
        instance.id.as_str(),
        "[{label}] {view:#}"
    );
    let attempts = view["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "[{label}] {view:#}");
    assert_eq!(attempts[0]["pool"], first_pool.as_str(), "{view:#}");
    assert_eq!(attempts[0]["state"], "succeeded", "[{label}] {view:#}");
    // Found by its tags, not created again; no other pool was asked.
    for (i, (pool, _, fake)) in fakes.0.iter().enumerate() {
        let want = usize::from(i == 0);
        assert_eq!(fake.creates(), want, "[{label}] creates at {pool}");
    }
    // Finished: the CA is installed (after a restart, by the adoption: the dead process did
    // not get to it).
    let ca = std::fs::read(dir.path().join("certs/ca.pem")).unwrap();
    assert_eq!(
        first_fake.ca(&made).as_deref(),
        Some(ca.as_slice()),
        "[{label}] the placed instance has no CA"
    );

    // The same create replayed is the same sandbox; still one instance.
    let r = http
        .post(format!("http://{}/v1/sandboxes", gateway.api))
        .bearer_auth(API_TOKEN)
        .header("idempotency-key", &idempotency_key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "[{label}]");
    let replay: Value = r.json().await.unwrap();
    assert_eq!(replay["id"], id.as_str(), "[{label}] {replay:#}");
    let live = fakes.live();
    assert_eq!(live.len(), 1, "[{label}] after the replay: {live:?}");
}

/// Each provider alone, one pool on its fake: killing the gateway mid-create and restarting
/// it leaves exactly one live instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_create_on_each_hosted_provider_leaves_exactly_one_live_instance() {
    for case in CASES {
        interrupt_mid_create(&[case], Interruption::Kill9AndRestart).await;
    }
}

/// Every provider's fake configured at once, one pool each in the table's order: the first
/// pool is tried first, and the restart keeps the create there (no other pool is asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_create_with_every_hosted_fake_configured_keeps_the_first_pool() {
    let all: Vec<&Case> = CASES.iter().collect();
    interrupt_mid_create(&all, Interruption::Kill9AndRestart).await;
}

/// A gateway paused past its create's lease (a stopped VM, a starved process) claims its own
/// create when it runs again. That create was stuck in `provisioning` for good, its instance
/// live and unplaced: the claim's drive found the walk active and left it, and the walk,
/// fenced by the claim's new epoch, stopped. Now the walk continues under the new lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_paused_past_its_lease_mid_create_still_places_exactly_one_instance() {
    for case in CASES {
        interrupt_mid_create(&[case], Interruption::PausedPastTheLease).await;
    }
}
