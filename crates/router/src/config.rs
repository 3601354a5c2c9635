//! Configuration model: `[[providers]]`, `[[accounts]]`, `[[pools]]`, built-in capability
//! defaults, validation, and compilation into an indexed [`Topology`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Recognized portable environments (seed 000).
pub const PORTABLE_ENVIRONMENTS: [&str; 3] = ["metal/base", "metal/node", "metal/python"];

/// Keys a pool selector or pool affinity term can use besides the pool's own labels. Pool labels
/// may not reuse them, otherwise a label could impersonate a property the router derives itself.
pub const RESERVED_LABEL_KEYS: [&str; 10] = [
    "pool",
    "provider",
    "provider_kind",
    "account",
    "geography",
    "region",
    "zone",
    "isolation",
    "egress",
    "vpc",
];

/// The built-in provider kinds. Their capability defaults follow seed 000's tables; `local` and
/// `simulated` are sandgate's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    E2b,
    Daytona,
    Modal,
    Vercel,
    Cloudflare,
    Runloop,
    Codesandbox,
    Northflank,
    Blaxel,
    Freestyle,
    PrimeIntellect,
    /// Linux namespaces on the gateway host; its network namespace only reaches sandgate.
    Local,
    /// In-memory provider for tests and demos; every capability is configurable.
    Simulated,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 13] = [
        ProviderKind::E2b,
        ProviderKind::Daytona,
        ProviderKind::Modal,
        ProviderKind::Vercel,
        ProviderKind::Cloudflare,
        ProviderKind::Runloop,
        ProviderKind::Codesandbox,
        ProviderKind::Northflank,
        ProviderKind::Blaxel,
        ProviderKind::Freestyle,
        ProviderKind::PrimeIntellect,
        ProviderKind::Local,
        ProviderKind::Simulated,
    ];

    /// The kebab-case name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::E2b => "e2b",
            ProviderKind::Daytona => "daytona",
            ProviderKind::Modal => "modal",
            ProviderKind::Vercel => "vercel",
            ProviderKind::Cloudflare => "cloudflare",
            ProviderKind::Runloop => "runloop",
            ProviderKind::Codesandbox => "codesandbox",
            ProviderKind::Northflank => "northflank",
            ProviderKind::Blaxel => "blaxel",
            ProviderKind::Freestyle => "freestyle",
            ProviderKind::PrimeIntellect => "prime-intellect",
            ProviderKind::Local => "local",
            ProviderKind::Simulated => "simulated",
        }
    }

    pub fn from_name(name: &str) -> Option<ProviderKind> {
        ProviderKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Declared capabilities before any configuration override.
    ///
    /// Capabilities the seed does not confirm for a provider (filesystem list/delete/append/mkdir,
    /// process cancellation, PTY) are declared absent: a requirement that depends on them must
    /// fail closed rather than land on a provider that might not honour it. Operators who have
    /// verified a capability can declare it under `[providers.capabilities]`.
    pub fn builtin_capabilities(self) -> Capabilities {
        use ProviderKind::*;
        let k = self;
        let lifecycle_only = matches!(k, Codesandbox | Northflank);
        let own = matches!(k, Local | Simulated);
        let isolation = match k {
            Blaxel | Codesandbox | E2b | Runloop | Vercel => vec![IsolationMode::kind("microvm")],
            Freestyle | PrimeIntellect => vec![IsolationMode::kind("vm")],
            Cloudflare | Daytona | Modal => vec![IsolationMode::kind("container")],
            Local => vec![IsolationMode::kind("namespace")],
            // Northflank's isolation is unknown; simulated must be configured.
            Northflank | Simulated => vec![],
        };
        Capabilities {
            environments: PORTABLE_ENVIRONMENTS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            image: matches!(
                k,
                Blaxel | Daytona | Modal | Northflank | Vercel | Simulated
            ),
            template: matches!(k, Codesandbox | E2b | Freestyle | Runloop | Simulated),
            templates: None,
            process: ProcessCapabilities {
                execute: !lifecycle_only,
                ordered_output: matches!(k, Cloudflare | E2b | Modal | Vercel) || own,
                cancel: own,
            },
            filesystem: FilesystemCapabilities {
                read: !lifecycle_only,
                write: !lifecycle_only,
                list: own,
                delete: own,
                append: own,
                mkdir: own,
            },
            isolation,
            public_ports: matches!(k, Blaxel | Local | Simulated),
            pause_resume: matches!(
                k,
                Codesandbox | E2b | Freestyle | Northflank | Runloop | Local | Simulated
            ),
            pty: k == Local,
            egress: if k == Local {
                EgressEnforcement::Gateway
            } else {
                EgressEnforcement::None
            },
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a pool enforces outbound network restrictions. Only `native` and `gateway` can satisfy a
/// request that restricts egress; `advisory` (proxy env vars only) is bypassable by the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EgressEnforcement {
    Native,
    Gateway,
    Advisory,
    #[default]
    None,
}

impl EgressEnforcement {
    pub fn enforces(self) -> bool {
        matches!(self, EgressEnforcement::Native | EgressEnforcement::Gateway)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            EgressEnforcement::Native => "native",
            EgressEnforcement::Gateway => "gateway",
            EgressEnforcement::Advisory => "advisory",
            EgressEnforcement::None => "none",
        }
    }
}

/// One complete isolation mode: `kind` plus any properties (`hypervisor`, `confidential`, ...).
///
/// Written either as a bare kind (`"microvm"`) or as a table (`{ kind = "microvm", hypervisor =
/// "firecracker" }`). A requirement matches a pool only if a *single* mode of the pool carries
/// every requested property, so properties of different modes are never mixed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct IsolationMode(pub BTreeMap<String, String>);

impl IsolationMode {
    pub fn kind(kind: &str) -> IsolationMode {
        let mut m = BTreeMap::new();
        m.insert("kind".to_string(), kind.to_string());
        IsolationMode(m)
    }
    pub fn with(mut self, key: &str, value: &str) -> IsolationMode {
        self.0.insert(key.to_string(), value.to_string());
        self
    }
    pub fn kind_name(&self) -> Option<&str> {
        self.0.get("kind").map(String::as_str)
    }
    /// True when every property of `self` is carried, with the same value, by `mode`.
    pub fn is_satisfied_by(&self, mode: &IsolationMode) -> bool {
        self.0.iter().all(|(k, v)| mode.0.get(k) == Some(v))
    }
}

impl<'de> Deserialize<'de> for IsolationMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Scalar {
            B(bool),
            I(i64),
            F(f64),
            S(String),
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Kind(String),
            Map(BTreeMap<String, Scalar>),
        }
        match Raw::deserialize(d)? {
            Raw::Kind(k) => Ok(IsolationMode::kind(&k)),
            Raw::Map(m) => {
                let m: BTreeMap<String, String> = m
                    .into_iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Scalar::B(b) => b.to_string(),
                            Scalar::I(i) => i.to_string(),
                            Scalar::F(f) => f.to_string(),
                            Scalar::S(s) => s,
                        };
                        (k, v)
                    })
                    .collect();
                if !m.contains_key("kind") {
                    return Err(serde::de::Error::custom("isolation mode needs a `kind`"));
                }
                Ok(IsolationMode(m))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ProcessCapabilities {
    pub execute: bool,
    pub ordered_output: bool,
    pub cancel: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct FilesystemCapabilities {
    pub read: bool,
    pub write: bool,
    pub list: bool,
    pub delete: bool,
    pub append: bool,
    pub mkdir: bool,
}

/// Resolved declared capabilities of a provider or (after pool narrowing) of a pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capabilities {
    /// Portable environments accepted as `source.environment`.
    pub environments: Vec<String>,
    /// OCI images accepted as `source.image`.
    pub image: bool,
    /// Provider templates accepted as `source.template`.
    pub template: bool,
    /// When set, only these template names are accepted.
    pub templates: Option<Vec<String>>,
    pub process: ProcessCapabilities,
    pub filesystem: FilesystemCapabilities,
    /// Complete isolation modes; empty means unknown, which never satisfies `features.isolation`.
    pub isolation: Vec<IsolationMode>,
    pub public_ports: bool,
    pub pause_resume: bool,
    pub pty: bool,
    pub egress: EgressEnforcement,
}

/// `sources` table (provider override or pool narrowing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourcesConfig {
    pub environments: Option<Vec<String>>,
    pub image: Option<bool>,
    pub template: Option<bool>,
    pub templates: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    pub execute: Option<bool>,
    pub ordered_output: Option<bool>,
    pub cancel: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemConfig {
    pub read: Option<bool>,
    pub write: Option<bool>,
    pub list: Option<bool>,
    pub delete: Option<bool>,
    pub append: Option<bool>,
    pub mkdir: Option<bool>,
}

/// `features` table (provider override or pool narrowing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeaturesConfig {
    pub process: Option<ProcessConfig>,
    pub filesystem: Option<FilesystemConfig>,
    pub public_ports: Option<bool>,
    pub pause_resume: Option<bool>,
    pub pty: Option<bool>,
}

/// `[providers.capabilities]`: replaces built-in defaults field by field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilitiesConfig {
    pub sources: Option<SourcesConfig>,
    pub isolation: Option<Vec<IsolationMode>>,
    pub features: Option<FeaturesConfig>,
    pub egress: Option<EgressEnforcement>,
}

/// `[[providers]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Name used by requests (`provider`, `fallback_providers`, `routing.order`).
    pub name: String,
    /// Built-in kind; defaults to `name` when that is a built-in kind.
    pub kind: Option<ProviderKind>,
    pub capabilities: Option<CapabilitiesConfig>,
}

/// Billing standing of an account. Routing records it; admission (not routing) refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BillingStanding {
    #[default]
    Good,
    PastDue,
    Suspended,
}

/// `[[accounts]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountConfig {
    pub name: String,
    pub provider: String,
    /// Reference to the credential (e.g. `env:E2B_API_KEY`, `vault:e2b-a`); never the secret.
    pub credential: Option<String>,
    #[serde(default)]
    pub billing: BillingStanding,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    // How sandgate reaches the account. Routing never reads these; the provider adapter does.
    /// The provider's API origin (a self-hosted deployment, a test fake); default: the
    /// provider's public API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the API key (read at start; never the key itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// A file holding the API key (e.g. a mounted secret; trailing newline ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<String>,
    /// Provider-specific settings (E2B `domain`, `template`; Daytona `organization_id`, ...):
    /// strings, numbers or booleans, handed to the adapter as text.
    #[serde(
        default,
        deserialize_with = "scalar_map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub options: BTreeMap<String, String>,
}

impl AccountConfig {
    /// An account with no labels, no credential and the provider's defaults.
    pub fn new(name: impl Into<String>, provider: impl Into<String>) -> AccountConfig {
        AccountConfig {
            name: name.into(),
            provider: provider.into(),
            credential: None,
            billing: BillingStanding::Good,
            labels: BTreeMap::new(),
            base_url: None,
            api_key_env: None,
            api_key_file: None,
            options: BTreeMap::new(),
        }
    }

    /// Whether the account names a credential in any of the ways it can.
    pub fn has_credential(&self) -> bool {
        self.credential.is_some() || self.api_key_env.is_some() || self.api_key_file.is_some()
    }
}

/// A table of scalars (string, integer, float, boolean) as text.
fn scalar_map<'de, D>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Int(i64),
        Float(f64),
        Bool(bool),
    }
    let map = BTreeMap::<String, Scalar>::deserialize(deserializer)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                Scalar::Text(t) => t,
                Scalar::Int(i) => i.to_string(),
                Scalar::Float(f) => f.to_string(),
                Scalar::Bool(b) => b.to_string(),
            };
            (k, text)
        })
        .collect())
}

/// Resource limits of a pool. A limit that is not declared cannot satisfy a request for that
/// resource (declared capabilities only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolResources {
    pub cpu: Option<f64>,
    pub memory_mb: Option<u64>,
    pub disk_gb: Option<u64>,
    /// Most processes and threads a sandbox may be given at once.
    #[serde(default)]
    pub pids: Option<u64>,
    pub gpu: Option<u32>,
    #[serde(default)]
    pub gpu_types: Vec<String>,
}

/// `[[pools]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    pub provider: String,
    pub account: String,
    pub geography: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    /// Complete isolation modes; defaults to the provider's.
    pub isolation: Option<Vec<IsolationMode>>,
    #[serde(default)]
    pub resources: PoolResources,
    /// Narrows the provider's sources.
    pub sources: Option<SourcesConfig>,
    /// Narrows the provider's features.
    pub features: Option<FeaturesConfig>,
    /// Tenancy, compliance, confidential computing, ...
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Network boundary the pool places sandboxes in.
    pub vpc: Option<String>,
    /// Configured price (any consistent unit); lower ranks first under `price`.
    pub price: Option<f64>,
    /// Configured capacity, used when the caller supplies no measured free capacity.
    pub capacity: Option<u64>,
    /// Defaults to the provider's.
    pub egress: Option<EgressEnforcement>,
    /// The Standby Pool: used only when the order includes `"standby"` or `routing.standby`.
    #[serde(default)]
    pub standby: bool,
}

/// The router's part of the configuration file. Deliberately *not* `deny_unknown_fields` so the
/// binary can flatten it into its own root config; each item is strict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterConfig {
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    #[serde(default)]
    pub accounts: Vec<AccountConfig>,
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
}

/// A validation error naming the offending key path, e.g. `pools[2].account`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every validation error found, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Normalized region: lowercase, `_` and spaces become `-`, so `US_East_1` equals `us-east-1`.
pub fn normalize_region(region: &str) -> String {
    region
        .trim()
        .chars()
        .map(|c| match c {
            '_' | ' ' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

fn apply_sources(caps: &mut Capabilities, s: &SourcesConfig) {
    if let Some(e) = &s.environments {
        caps.environments = e.clone();
    }
    if let Some(b) = s.image {
        caps.image = b;
    }
    if let Some(b) = s.template {
        caps.template = b;
    }
    if let Some(t) = &s.templates {
        caps.templates = Some(t.clone());
    }
}

fn apply_features(caps: &mut Capabilities, f: &FeaturesConfig) {
    if let Some(p) = &f.process {
        set(&mut caps.process.execute, p.execute);
        set(&mut caps.process.ordered_output, p.ordered_output);
        set(&mut caps.process.cancel, p.cancel);
    }
    if let Some(fs) = &f.filesystem {
        set(&mut caps.filesystem.read, fs.read);
        set(&mut caps.filesystem.write, fs.write);
        set(&mut caps.filesystem.list, fs.list);
        set(&mut caps.filesystem.delete, fs.delete);
        set(&mut caps.filesystem.append, fs.append);
        set(&mut caps.filesystem.mkdir, fs.mkdir);
    }
    set(&mut caps.public_ports, f.public_ports);
    set(&mut caps.pause_resume, f.pause_resume);
    set(&mut caps.pty, f.pty);
}

fn set(dst: &mut bool, v: Option<bool>) {
    if let Some(v) = v {
        *dst = v;
    }
}

impl Capabilities {
    /// The boolean features, each under the path a request asks for it by (`features.…`).
    pub fn feature_flags(&self) -> [(&'static str, bool); 12] {
        [
            ("features.process.execute", self.process.execute),
            (
                "features.process.ordered_output",
                self.process.ordered_output,
            ),
            ("features.process.cancel", self.process.cancel),
            ("features.filesystem.read", self.filesystem.read),
            ("features.filesystem.write", self.filesystem.write),
            ("features.filesystem.list", self.filesystem.list),
            ("features.filesystem.delete", self.filesystem.delete),
            ("features.filesystem.append", self.filesystem.append),
            ("features.filesystem.mkdir", self.filesystem.mkdir),
            ("features.public_ports", self.public_ports),
            ("features.pause_resume", self.pause_resume),
            ("features.pty", self.pty),
        ]
    }
}

impl FeaturesConfig {
    /// The setting for one of [`Capabilities::feature_flags`]' paths (its tables made when
    /// missing); `None` for a path that is not one of them.
    pub fn slot(&mut self, path: &str) -> Option<&mut Option<bool>> {
        let rest = path.strip_prefix("features.")?;
        if let Some(name) = rest.strip_prefix("process.") {
            let p = self.process.get_or_insert_with(Default::default);
            return match name {
                "execute" => Some(&mut p.execute),
                "ordered_output" => Some(&mut p.ordered_output),
                "cancel" => Some(&mut p.cancel),
                _ => None,
            };
        }
        if let Some(name) = rest.strip_prefix("filesystem.") {
            let f = self.filesystem.get_or_insert_with(Default::default);
            return match name {
                "read" => Some(&mut f.read),
                "write" => Some(&mut f.write),
                "list" => Some(&mut f.list),
                "delete" => Some(&mut f.delete),
                "append" => Some(&mut f.append),
                "mkdir" => Some(&mut f.mkdir),
                _ => None,
            };
        }
        match rest {
            "public_ports" => Some(&mut self.public_ports),
            "pause_resume" => Some(&mut self.pause_resume),
            "pty" => Some(&mut self.pty),
            _ => None,
        }
    }
}

/// A provider after defaults and overrides.
#[derive(Debug, Clone)]
pub struct Provider {
    pub name: Arc<str>,
    pub kind: ProviderKind,
    pub capabilities: Capabilities,
}

/// An account after validation.
#[derive(Debug, Clone)]
pub struct Account {
    pub name: Arc<str>,
    pub provider: usize,
    pub credential: Option<String>,
    pub billing: BillingStanding,
    pub labels: BTreeMap<String, String>,
    /// Whether a credential is named (`credential`, `api_key_env` or `api_key_file`).
    pub bound: bool,
}

/// A pool after validation, with effective (provider ∧ pool) capabilities.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: Arc<str>,
    pub provider: usize,
    pub account: usize,
    pub geography: Option<String>,
    /// Normalized.
    pub region: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    pub region_id: Option<u32>,
    pub zone_id: Option<u32>,
    pub capabilities: Capabilities,
    pub resources: PoolResources,
    pub labels: BTreeMap<String, String>,
    pub vpc: Option<String>,
    pub price: Option<f64>,
    pub capacity: Option<u64>,
    pub standby: bool,
    /// Position in name order: the final, deterministic tie-break.
    pub name_rank: u32,
}

/// Capability bits of [`Hot::mask`].
pub(crate) mod bit {
    pub const ENV_BASE: u32 = 1 << 0;
    pub const ENV_NODE: u32 = 1 << 1;
    pub const ENV_PYTHON: u32 = 1 << 2;
    pub const IMAGE: u32 = 1 << 3;
    pub const TEMPLATE: u32 = 1 << 4;
    pub const EXECUTE: u32 = 1 << 5;
    pub const ORDERED_OUTPUT: u32 = 1 << 6;
    pub const CANCEL: u32 = 1 << 7;
    pub const READ: u32 = 1 << 8;
    pub const WRITE: u32 = 1 << 9;
    pub const LIST: u32 = 1 << 10;
    pub const DELETE: u32 = 1 << 11;
    pub const APPEND: u32 = 1 << 12;
    pub const MKDIR: u32 = 1 << 13;
    pub const PUBLIC_PORTS: u32 = 1 << 14;
    pub const PAUSE_RESUME: u32 = 1 << 15;
    pub const PTY: u32 = 1 << 16;
    pub const EGRESS_ENFORCED: u32 = 1 << 17;
}

pub(crate) const NONE_ID: u32 = u32::MAX;

/// The routing-relevant facts of a pool packed contiguously. Scanning 10,000 `Pool`s chases
/// pointers into strings, vectors and maps for every pool; this keeps the common rejections to
/// one cache-friendly pass. It is only a prefilter: the full check still decides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hot {
    pub mask: u32,
    pub iso_set: u32,
    pub provider: u32,
    pub region: u32,
    pub vpc: u32,
    pub standby: bool,
    pub cpu: f64,
    pub memory_mb: u64,
    pub disk_gb: u64,
    pub pids: u64,
}

fn mask_of(c: &Capabilities) -> u32 {
    let mut m = 0;
    for (env, b) in [
        ("metal/base", bit::ENV_BASE),
        ("metal/node", bit::ENV_NODE),
        ("metal/python", bit::ENV_PYTHON),
    ] {
        if c.environments.iter().any(|e| e == env) {
            m |= b;
        }
    }
    let flags = [
        (c.image, bit::IMAGE),
        (c.template, bit::TEMPLATE),
        (c.process.execute, bit::EXECUTE),
        (c.process.ordered_output, bit::ORDERED_OUTPUT),
        (c.process.cancel, bit::CANCEL),
        (c.filesystem.read, bit::READ),
        (c.filesystem.write, bit::WRITE),
        (c.filesystem.list, bit::LIST),
        (c.filesystem.delete, bit::DELETE),
        (c.filesystem.append, bit::APPEND),
        (c.filesystem.mkdir, bit::MKDIR),
        (c.public_ports, bit::PUBLIC_PORTS),
        (c.pause_resume, bit::PAUSE_RESUME),
        (c.pty, bit::PTY),
        (c.egress.enforces(), bit::EGRESS_ENFORCED),
    ];
    for (on, b) in flags {
        if on {
            m |= b;
        }
    }
    m
}

/// Validated, indexed configuration. Build once per configuration change and share it; routing
/// only reads it.
#[derive(Debug, Clone)]
pub struct Topology {
    pub(crate) providers: Vec<Provider>,
    pub(crate) accounts: Vec<Account>,
    pub(crate) pools: Vec<Pool>,
    pub(crate) provider_index: HashMap<String, usize>,
    pub(crate) pool_index: HashMap<String, usize>,
    pub(crate) region_index: HashMap<Arc<str>, u32>,
    pub(crate) zone_index: HashMap<Arc<str>, u32>,
    pub(crate) vpc_index: HashMap<String, u32>,
    pub(crate) iso_sets: Vec<Vec<IsolationMode>>,
    pub(crate) hot: Vec<Hot>,
}

impl RouterConfig {
    /// Checks the whole configuration; every error names its key path.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        self.compile().map(|_| ())
    }

    /// Validates and builds the indexed topology.
    pub fn compile(&self) -> Result<Topology, ConfigErrors> {
        Topology::new(self)
    }
}

fn err(errs: &mut Vec<ConfigError>, path: String, message: String) {
    errs.push(ConfigError { path, message });
}

fn check_name(errs: &mut Vec<ConfigError>, path: String, name: &str) {
    if name.trim().is_empty() {
        err(errs, path, "must not be empty".into());
    } else if name == "standby" {
        err(
            errs,
            path,
            "\"standby\" is reserved for routing orders".into(),
        );
    }
}

impl Topology {
    pub fn new(cfg: &RouterConfig) -> Result<Topology, ConfigErrors> {
        let mut errs = Vec::new();
        let mut providers = Vec::new();
        let mut provider_index = HashMap::new();
        for (i, p) in cfg.providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            check_name(&mut errs, format!("{at}.name"), &p.name);
            if provider_index.insert(p.name.clone(), i).is_some() {
                err(
                    &mut errs,
                    format!("{at}.name"),
                    format!("duplicate provider \"{}\"", p.name),
                );
            }
            let kind = match p.kind.or_else(|| ProviderKind::from_name(&p.name)) {
                Some(k) => k,
                None => {
                    err(
                        &mut errs,
                        format!("{at}.kind"),
                        format!(
                            "missing, and \"{}\" is not a built-in provider kind",
                            p.name
                        ),
                    );
                    ProviderKind::Simulated
                }
            };
            let mut caps = kind.builtin_capabilities();
            if let Some(c) = &p.capabilities {
                if let Some(s) = &c.sources {
                    apply_sources(&mut caps, s);
                }
                if let Some(iso) = &c.isolation {
                    caps.isolation = iso.clone();
                }
                if let Some(f) = &c.features {
                    apply_features(&mut caps, f);
                }
                if let Some(e) = c.egress {
                    caps.egress = e;
                }
                check_environments(&mut errs, &format!("{at}.capabilities.sources"), &caps);
            }
            providers.push(Provider {
                name: p.name.as_str().into(),
                kind,
                capabilities: caps,
            });
        }

        let mut accounts = Vec::new();
        let mut account_index = HashMap::new();
        for (i, a) in cfg.accounts.iter().enumerate() {
            let at = format!("accounts[{i}]");
            check_name(&mut errs, format!("{at}.name"), &a.name);
            if account_index.insert(a.name.clone(), i).is_some() {
                err(
                    &mut errs,
                    format!("{at}.name"),
                    format!("duplicate account \"{}\"", a.name),
                );
            }
            let provider = match provider_index.get(&a.provider) {
                Some(&p) => p,
                None => {
                    err(
                        &mut errs,
                        format!("{at}.provider"),
                        format!("unknown provider \"{}\"", a.provider),
                    );
                    usize::MAX
                }
            };
            accounts.push(Account {
                name: a.name.as_str().into(),
                provider,
                credential: a.credential.clone(),
                billing: a.billing,
                labels: a.labels.clone(),
                bound: a.has_credential(),
            });
        }

        let mut names: Vec<(&str, usize)> = cfg
            .pools
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.as_str(), i))
            .collect();
        names.sort();
        let mut name_rank = vec![0u32; cfg.pools.len()];
        for (rank, (_, i)) in names.iter().enumerate() {
            name_rank[*i] = rank as u32;
        }

        let mut pools = Vec::new();
        let mut pool_index = HashMap::new();
        let mut region_index: HashMap<Arc<str>, u32> = HashMap::new();
        let mut zone_index: HashMap<Arc<str>, u32> = HashMap::new();
        for (i, p) in cfg.pools.iter().enumerate() {
            let at = format!("pools[{i}]");
            check_name(&mut errs, format!("{at}.name"), &p.name);
            if pool_index.insert(p.name.clone(), i).is_some() {
                err(
                    &mut errs,
                    format!("{at}.name"),
                    format!("duplicate pool \"{}\"", p.name),
                );
            }
            let provider = provider_index.get(&p.provider).copied();
            if provider.is_none() {
                err(
                    &mut errs,
                    format!("{at}.provider"),
                    format!("unknown provider \"{}\"", p.provider),
                );
            }
            let account = account_index.get(&p.account).copied();
            match account {
                None => err(
                    &mut errs,
                    format!("{at}.account"),
                    format!("unknown account \"{}\"", p.account),
                ),
                Some(a) => {
                    if provider.is_some() && cfg.accounts[a].provider != p.provider {
                        err(
                            &mut errs,
                            format!("{at}.account"),
                            format!(
                                "account \"{}\" belongs to provider \"{}\", not \"{}\"",
                                p.account, cfg.accounts[a].provider, p.provider
                            ),
                        );
                    }
                }
            }
            let Some(provider) = provider else { continue };
            let base = &providers[provider].capabilities;
            let mut caps = base.clone();
            if let Some(iso) = &p.isolation {
                for (j, mode) in iso.iter().enumerate() {
                    // A pool mode refines one of the provider's modes; it may not invent one.
                    if !base.isolation.iter().any(|b| b.is_satisfied_by(mode)) {
                        err(
                            &mut errs,
                            format!("{at}.isolation[{j}]"),
                            format!(
                                "provider \"{}\" declares no isolation mode that {:?} refines",
                                p.provider, mode.0
                            ),
                        );
                    }
                }
                caps.isolation = iso.clone();
            }
            if let Some(s) = &p.sources {
                apply_sources(&mut caps, s);
                for env in &caps.environments {
                    if !base.environments.contains(env) {
                        err(
                            &mut errs,
                            format!("{at}.sources.environments"),
                            format!(
                                "provider \"{}\" does not support environment \"{env}\"",
                                p.provider
                            ),
                        );
                    }
                }
                if caps.image && !base.image {
                    err(
                        &mut errs,
                        format!("{at}.sources.image"),
                        format!("provider \"{}\" does not support OCI images", p.provider),
                    );
                }
                if caps.template && !base.template {
                    err(
                        &mut errs,
                        format!("{at}.sources.template"),
                        format!("provider \"{}\" does not support templates", p.provider),
                    );
                }
            }
            if let Some(f) = &p.features {
                apply_features(&mut caps, f);
                for ((path, pool_has), (_, prov_has)) in
                    caps.feature_flags().into_iter().zip(base.feature_flags())
                {
                    if pool_has && !prov_has {
                        err(
                            &mut errs,
                            format!("{at}.{path}"),
                            format!(
                                "provider \"{}\" does not declare this capability",
                                p.provider
                            ),
                        );
                    }
                }
            }
            if let Some(e) = p.egress {
                caps.egress = e;
            }
            for key in p.labels.keys() {
                if RESERVED_LABEL_KEYS.contains(&key.as_str()) || key.starts_with("account.") {
                    err(
                        &mut errs,
                        format!("{at}.labels.{key}"),
                        "reserved key; it is derived from the pool itself".into(),
                    );
                }
            }
            if let Some(price) = p.price {
                if !price.is_finite() || price < 0.0 {
                    err(
                        &mut errs,
                        format!("{at}.price"),
                        "must be a finite number >= 0".into(),
                    );
                }
            }
            if let Some(cpu) = p.resources.cpu {
                if !cpu.is_finite() || cpu < 0.0 {
                    err(
                        &mut errs,
                        format!("{at}.resources.cpu"),
                        "must be a finite number >= 0".into(),
                    );
                }
            }
            let region: Option<Arc<str>> = match &p.region {
                Some(r) if normalize_region(r).is_empty() => {
                    err(
                        &mut errs,
                        format!("{at}.region"),
                        "must not be empty".into(),
                    );
                    None
                }
                Some(r) => Some(normalize_region(r).into()),
                None => None,
            };
            let zone: Option<Arc<str>> = p.zone.as_deref().map(Into::into);
            let region_id = region.as_ref().map(|r| {
                let n = region_index.len() as u32;
                *region_index.entry(r.clone()).or_insert(n)
            });
            let zone_id = zone.as_ref().map(|z| {
                let n = zone_index.len() as u32;
                *zone_index.entry(z.clone()).or_insert(n)
            });
            pools.push(Pool {
                name: p.name.as_str().into(),
                provider,
                account: account.unwrap_or(usize::MAX),
                geography: p.geography.clone(),
                region,
                zone,
                region_id,
                zone_id,
                capabilities: caps,
                resources: p.resources.clone(),
                labels: p.labels.clone(),
                vpc: p.vpc.clone(),
                price: p.price,
                capacity: p.capacity,
                standby: p.standby,
                name_rank: name_rank[i],
            });
        }
        if !errs.is_empty() {
            return Err(ConfigErrors(errs));
        }
        let mut vpc_index: HashMap<String, u32> = HashMap::new();
        let mut iso_index: HashMap<Vec<IsolationMode>, u32> = HashMap::new();
        let mut iso_sets = Vec::new();
        let hot = pools
            .iter()
            .map(|p| {
                let iso_set = *iso_index
                    .entry(p.capabilities.isolation.clone())
                    .or_insert_with(|| {
                        iso_sets.push(p.capabilities.isolation.clone());
                        iso_sets.len() as u32 - 1
                    });
                let vpc = p.vpc.as_ref().map_or(NONE_ID, |v| {
                    let n = vpc_index.len() as u32;
                    *vpc_index.entry(v.clone()).or_insert(n)
                });
                Hot {
                    mask: mask_of(&p.capabilities),
                    iso_set,
                    provider: p.provider as u32,
                    region: p.region_id.unwrap_or(NONE_ID),
                    vpc,
                    standby: p.standby,
                    cpu: p.resources.cpu.unwrap_or(-1.0),
                    memory_mb: p.resources.memory_mb.unwrap_or(0),
                    disk_gb: p.resources.disk_gb.unwrap_or(0),
                    pids: p.resources.pids.unwrap_or(0),
                }
            })
            .collect();
        Ok(Topology {
            providers,
            accounts,
            pools,
            provider_index,
            pool_index,
            region_index,
            zone_index,
            vpc_index,
            iso_sets,
            hot,
        })
    }

    pub fn providers(&self) -> &[Provider] {
        &self.providers
    }
    pub fn accounts(&self) -> &[Account] {
        &self.accounts
    }
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }
    pub fn provider(&self, name: &str) -> Option<&Provider> {
        self.provider_index.get(name).map(|&i| &self.providers[i])
    }
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pool_index.get(name).map(|&i| &self.pools[i])
    }
}

fn check_environments(errs: &mut Vec<ConfigError>, at: &str, caps: &Capabilities) {
    for env in &caps.environments {
        if !PORTABLE_ENVIRONMENTS.contains(&env.as_str()) {
            err(
                errs,
                format!("{at}.environments"),
                format!("\"{env}\" is not a recognized portable environment (metal/base, metal/node, metal/python)"),
            );
        }
    }
}
