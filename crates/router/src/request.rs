//! The routing-relevant part of a create request (`POST /v1/sandboxes`).
//!
//! The top level accepts unknown fields because the full create body carries more (`workspace`,
//! `credentials`, ...). Every nested object that expresses a requirement or preference is
//! `deny_unknown_fields`: a requirement the router does not understand must be rejected, not
//! silently dropped, or a sandbox could land somewhere that does not honour it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::IsolationMode;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Request {
    /// Explicit primary provider. Only its pools skip the portable baseline.
    pub provider: Option<String>,
    pub fallback_providers: Vec<String>,
    pub source: Option<Source>,
    pub resources: Resources,
    pub features: Features,
    pub network: Network,
    /// Acceptable regions (normalized before comparison); empty means any.
    pub regions: Vec<String>,
    /// The new sandbox's own labels (used by self-affinity).
    pub labels: BTreeMap<String, String>,
    pub routing: Routing,
}

/// Exactly one of `{"environment": ...}`, `{"image": ...}`, `{"template": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Environment(String),
    Image(String),
    Template(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resources {
    pub cpu: Option<f64>,
    pub memory_mb: Option<u64>,
    pub disk_gb: Option<u64>,
    pub gpu: Option<u32>,
    pub gpu_type: Option<String>,
}

/// `Some(true)` requires a feature, `Some(false)` opts out of it (only meaningful for the portable
/// baseline), `None` leaves it to the baseline rules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Features {
    pub isolation: Option<IsolationMode>,
    pub process: ProcessFeatures,
    pub filesystem: FilesystemFeatures,
    pub public_ports: Option<bool>,
    pub pause_resume: Option<bool>,
    pub pty: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessFeatures {
    pub execute: Option<bool>,
    pub ordered_output: Option<bool>,
    pub cancel: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesystemFeatures {
    pub read: Option<bool>,
    pub write: Option<bool>,
    pub list: Option<bool>,
    pub delete: Option<bool>,
    pub append: Option<bool>,
    pub mkdir: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Network {
    pub allow_domains: Vec<String>,
    pub deny_all: bool,
    pub cidrs: Vec<String>,
    /// A bound VPC: only pools inside it qualify.
    pub vpc: Option<String>,
}

impl Network {
    /// True when the request restricts egress, which only an enforcing pool can honour.
    pub fn restricts_egress(&self) -> bool {
        !self.allow_domains.is_empty() || self.deny_all || !self.cidrs.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Configured price, lower first.
    Price,
    /// Median measured startup latency, lower first.
    StartupLatency,
    /// Share of eligible attempts that reached running, higher first.
    CreationSuccess,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Price => "price",
            Priority::StartupLatency => "startup_latency",
            Priority::CreationSuccess => "creation_success",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopologyKey {
    Provider,
    Region,
    Zone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operator {
    #[default]
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// A test over one pool label (or derived key such as `region`, `isolation`, `account.team`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelExpr {
    pub key: String,
    #[serde(default)]
    pub operator: Operator,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedLabelExpr {
    pub weight: u32,
    pub key: String,
    #[serde(default)]
    pub operator: Operator,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolAffinity {
    /// Every term must match.
    pub required: Vec<LabelExpr>,
    /// Matching terms add their weight to the soft score.
    pub preferred: Vec<WeightedLabelExpr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxTerm {
    pub topology: TopologyKey,
    /// Existing sandboxes whose labels contain all of these match; empty matches every sandbox.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedSandboxTerm {
    pub weight: u32,
    pub topology: TopologyKey,
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxAffinity {
    pub required: Vec<SandboxTerm>,
    pub preferred: Vec<WeightedSandboxTerm>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpreadMode {
    /// Filter: placing here may not push the skew above `max_skew`.
    #[default]
    Hard,
    /// Rank: fewer matching sandboxes in the pool's domain ranks first.
    Soft,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpreadTerm {
    pub topology: TopologyKey,
    #[serde(default = "one")]
    pub max_skew: u32,
    #[serde(default)]
    pub mode: SpreadMode,
    /// Soft mode: penalty per matching sandbox in the domain.
    #[serde(default = "one")]
    pub weight: u32,
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

/// `"auto"` (workspace Auto order, else configured order) or an explicit list of provider names;
/// the entry `"standby"` places the Standby Pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Order {
    Auto(AutoKeyword),
    Providers(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AutoKeyword {
    #[serde(rename = "auto")]
    Auto,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Routing {
    pub priorities: Vec<Priority>,
    pub pin_pool: Option<String>,
    /// Required exact matches over pool labels and derived keys.
    pub pool_selector: BTreeMap<String, String>,
    pub pool_affinity: PoolAffinity,
    pub sandbox_affinity: SandboxAffinity,
    pub sandbox_anti_affinity: SandboxAffinity,
    pub spread: Vec<SpreadTerm>,
    pub order: Option<Order>,
    /// Append the Standby Pool to the order.
    pub standby: bool,
}
