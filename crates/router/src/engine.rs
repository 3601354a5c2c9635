//! Filter, rank and place.

use std::sync::Arc;

use serde::Serialize;

use crate::config::{bit, normalize_region, Pool, Topology, NONE_ID};
use crate::context::{Bands, PoolStats, RouteContext};
use crate::error::{Attempt, NoEligible};
use crate::request::{Operator, Order, Priority, Request, Source, SpreadMode, TopologyKey};

/// One pool to try, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub pool: Arc<str>,
    pub provider: Arc<str>,
    pub account: Arc<str>,
    pub region: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    pub standby: bool,
    /// Whether the portable baseline was required of this pool (automatic routing). The create
    /// engine re-checks the same requirement set against discovered capabilities.
    pub baseline: bool,
}

/// The ordered candidate list: try the first, fail over down the list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Route {
    pub candidates: Vec<Candidate>,
}

/// Why routing ordered the pools as it did. Serialized as JSON:
///
/// ```json
/// {
///   "automatic": true,
///   "baseline": ["features.process.execute", "features.filesystem.read", "features.filesystem.write"],
///   "priorities": ["price", "startup_latency"],
///   "bands": {"price": 0.0, "startup_latency_ms": 250.0, "creation_success": 0.05},
///   "pools": [{
///     "pool": "e2b-use1", "provider": "e2b", "account": "acct-a",
///     "region": "us-east-1", "zone": null, "standby": false,
///     "eligible": true, "unmet_requirements": [], "baseline_applied": true,
///     "tier": 0,
///     "rank": [{"priority": "price", "value": 0.1, "band": null},
///              {"priority": "startup_latency", "value": 900.0, "band": 3}],
///     "metrics": {"price": 0.1, "startup_latency_ms": 900.0, "startup_latency_samples": 12,
///                 "creation_success": 0.98, "attempts": 50},
///     "soft_score": 0, "free_capacity": 10, "position": 0
///   }],
///   "order": ["e2b-use1"],
///   "error": null
/// }
/// ```
///
/// `pools` lists every configured pool in configuration order. `tier` is the position of the
/// pool's provider in the candidate order (explicit provider, fallbacks, then the order in force;
/// `null` when the order excludes it). `band` is `null` when the band width is `0` (exact
/// comparison of `value`). `position` is the index in `order`, `null` for ineligible pools.
/// `error` is the `no_eligible_provider` error `route` would return, when `order` is empty.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    pub automatic: bool,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub baseline: Vec<&'static str>,
    pub priorities: Vec<Priority>,
    pub bands: Bands,
    pub pools: Vec<PoolExplanation>,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub order: Vec<Arc<str>>,
    pub error: Option<NoEligible>,
    /// Ineligible pools left out of `pools` ([`route_recorded`] only; absent when `0`).
    #[serde(skip_serializing_if = "is_zero")]
    pub ineligible_omitted: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolExplanation {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub pool: Arc<str>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub provider: Arc<str>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub account: Arc<str>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub region: Option<Arc<str>>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub zone: Option<Arc<str>>,
    pub standby: bool,
    pub eligible: bool,
    pub unmet_requirements: Vec<String>,
    pub baseline_applied: bool,
    pub tier: Option<u32>,
    pub rank: Vec<RankKey>,
    pub metrics: Metrics,
    pub soft_score: i64,
    pub free_capacity: Option<u64>,
    pub position: Option<usize>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankKey {
    pub priority: Priority,
    pub value: Option<f64>,
    pub band: Option<i64>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    pub price: Option<f64>,
    pub startup_latency_ms: Option<f64>,
    pub startup_latency_samples: usize,
    pub creation_success: Option<f64>,
    pub attempts: u64,
}

/// An unmet requirement, rendered lazily so the common (eligible) path never allocates.
#[derive(Debug, Clone)]
enum Unmet {
    Path(&'static str),
    Index(&'static str, usize),
    Key(&'static str, String),
}

impl Unmet {
    fn render(&self) -> String {
        match self {
            Unmet::Path(p) => (*p).to_string(),
            Unmet::Index(p, i) => format!("{p}[{i}]"),
            Unmet::Key(p, k) => format!("{p}.{k}"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    tier: Option<u32>,
    excluded: Option<&'static str>,
}

const EXCLUDED: Slot = Slot {
    tier: None,
    excluded: Some("provider"),
};

struct Expr {
    key: String,
    op: Operator,
    values: Vec<String>,
}

/// Matching-sandbox counts per domain of one topology key.
struct Counts {
    key: TopologyKey,
    per_domain: Vec<u32>,
    /// Matching sandboxes anywhere, including domains no pool is in.
    total: u32,
}

impl Counts {
    fn at(&self, d: Option<u32>) -> Option<u32> {
        d.map(|d| self.per_domain[d as usize])
    }
}

struct Plan<'a> {
    topo: &'a Topology,
    req: &'a Request,
    ctx: &'a RouteContext,
    slots: Vec<Slot>,
    standby: Slot,
    explicit_provider: Option<usize>,
    pin: Option<Option<usize>>,
    regions: Vec<String>,
    selector: Vec<Expr>,
    affinity_required: Vec<Expr>,
    affinity_preferred: Vec<(i64, Expr)>,
    sandbox_required: Vec<(Counts, bool)>,
    anti_required: Vec<Counts>,
    sandbox_preferred: Vec<(i64, Counts)>,
    anti_preferred: Vec<(i64, Counts)>,
    spread: Vec<(u32, SpreadMode, i64, Counts)>,
    priorities: Vec<Priority>,
    pre: Prefilter,
}

/// The request reduced to what [`crate::config::Hot`] can answer.
struct Prefilter {
    /// Required capability bits for pools that get the portable baseline, and for those that don't.
    need_auto: u32,
    need_explicit: u32,
    /// Indexed by isolation set; `None` when no isolation is requested.
    iso_ok: Option<Vec<bool>>,
    /// Indexed by region id; `None` when any region will do.
    region_ok: Option<Vec<bool>>,
    /// `Some(NONE_ID)` when the requested VPC belongs to no pool.
    vpc: Option<u32>,
    /// A requirement no pool can meet (unrecognized environment).
    impossible: bool,
}

impl Prefilter {
    fn new(topo: &Topology, req: &Request) -> Prefilter {
        let f = &req.features;
        let mut need = 0u32;
        let mut impossible = false;
        match &req.source {
            Some(Source::Environment(e)) => match e.as_str() {
                "metal/base" => need |= bit::ENV_BASE,
                "metal/node" => need |= bit::ENV_NODE,
                "metal/python" => need |= bit::ENV_PYTHON,
                _ => impossible = true,
            },
            Some(Source::Image(_)) => need |= bit::IMAGE,
            Some(Source::Template(_)) => need |= bit::TEMPLATE,
            None => {}
        }
        let on = |v: Option<bool>, b: u32| if v == Some(true) { b } else { 0 };
        need |= on(f.process.execute, bit::EXECUTE)
            | on(f.process.ordered_output, bit::ORDERED_OUTPUT)
            | on(f.process.cancel, bit::CANCEL)
            | on(f.filesystem.read, bit::READ)
            | on(f.filesystem.write, bit::WRITE)
            | on(f.filesystem.list, bit::LIST)
            | on(f.filesystem.delete, bit::DELETE)
            | on(f.filesystem.append, bit::APPEND)
            | on(f.filesystem.mkdir, bit::MKDIR)
            | on(f.public_ports, bit::PUBLIC_PORTS)
            | on(f.pause_resume, bit::PAUSE_RESUME)
            | on(f.pty, bit::PTY);
        if req.network.restricts_egress() {
            need |= bit::EGRESS_ENFORCED;
        }
        let base = |v: Option<bool>, b: u32| if v.is_none() { b } else { 0 };
        let need_auto = need
            | base(f.process.execute, bit::EXECUTE)
            | base(f.filesystem.read, bit::READ)
            | base(f.filesystem.write, bit::WRITE);
        let iso_ok = f.isolation.as_ref().map(|iso| {
            topo.iso_sets
                .iter()
                .map(|set| set.iter().any(|m| iso.is_satisfied_by(m)))
                .collect()
        });
        let region_ok = (!req.regions.is_empty()).then(|| {
            let mut ok = vec![false; topo.region_index.len()];
            for r in &req.regions {
                if let Some(&id) = topo.region_index.get(normalize_region(r).as_str()) {
                    ok[id as usize] = true;
                }
            }
            ok
        });
        let vpc = req
            .network
            .vpc
            .as_ref()
            .map(|v| topo.vpc_index.get(v).copied().unwrap_or(NONE_ID));
        Prefilter {
            need_auto,
            need_explicit: need,
            iso_ok,
            region_ok,
            vpc,
            impossible,
        }
    }
}

fn labels_match(
    want: &std::collections::BTreeMap<String, String>,
    have: &std::collections::BTreeMap<String, String>,
) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

fn compile_expr(key: &str, op: Operator, values: &[String]) -> Expr {
    let values = if key == "region" {
        values.iter().map(|v| normalize_region(v)).collect()
    } else {
        values.to_vec()
    };
    Expr {
        key: key.to_string(),
        op,
        values,
    }
}

fn domain(topo: &Topology, pool: &Pool, key: TopologyKey) -> Option<u32> {
    let _ = topo;
    match key {
        TopologyKey::Provider => Some(pool.provider as u32),
        TopologyKey::Region => pool.region_id,
        TopologyKey::Zone => pool.zone_id,
    }
}

fn counts(
    topo: &Topology,
    ctx: &RouteContext,
    key: TopologyKey,
    labels: &std::collections::BTreeMap<String, String>,
) -> Counts {
    let size = match key {
        TopologyKey::Provider => topo.providers.len(),
        TopologyKey::Region => topo.region_index.len(),
        TopologyKey::Zone => topo.zone_index.len(),
    };
    let mut per_domain = vec![0u32; size];
    let mut total = 0;
    for s in &ctx.sandboxes {
        if !labels_match(labels, &s.labels) {
            continue;
        }
        total += 1;
        let d = match key {
            TopologyKey::Provider => topo.provider_index.get(&s.provider).map(|&i| i as u32),
            TopologyKey::Region => s
                .region
                .as_deref()
                .and_then(|r| topo.region_index.get(normalize_region(r).as_str()).copied()),
            TopologyKey::Zone => s
                .zone
                .as_deref()
                .and_then(|z| topo.zone_index.get(z).copied()),
        };
        if let Some(d) = d {
            per_domain[d as usize] += 1;
        }
    }
    Counts {
        key,
        per_domain,
        total,
    }
}

/// f64 -> u64 preserving order.
fn ordered(v: f64) -> u64 {
    let b = v.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | (1 << 63)
    }
}

fn band_of(v: f64, width: f64, higher_better: bool) -> i64 {
    let x = if higher_better { 1.0 - v } else { v };
    // The epsilon keeps exact multiples of the width (0.1 / 0.05) from falling a band short.
    (x / width + 1e-9).floor() as i64
}

impl<'a> Plan<'a> {
    fn new(topo: &'a Topology, req: &'a Request, ctx: &'a RouteContext) -> Plan<'a> {
        let np = topo.providers.len();
        let mut slots = vec![EXCLUDED; np];
        let mut assigned = vec![false; np];
        let mut tier = 0u32;
        let explicit_provider = req
            .provider
            .as_deref()
            .and_then(|p| topo.provider_index.get(p).copied());
        let explicit_order = match &req.routing.order {
            Some(Order::Providers(v)) => Some(v),
            _ => None,
        };
        let in_order = |name: &str| explicit_order.is_none_or(|o| o.iter().any(|e| e == name));
        let named = req.provider.iter().chain(req.fallback_providers.iter());
        for name in named {
            let Some(&p) = topo.provider_index.get(name.as_str()) else {
                continue;
            };
            if assigned[p] {
                continue; // candidates are unique
            }
            assigned[p] = true;
            slots[p] = if in_order(name) {
                Slot {
                    tier: Some(tier),
                    excluded: None,
                }
            } else {
                Slot {
                    tier: None,
                    excluded: Some("routing.order"),
                }
            };
            tier += 1;
        }
        let named_tiers = tier;
        // The order in force for automatic selection and for placing the Standby Pool.
        let order_list = explicit_order.or(ctx.workspace_order.as_ref());
        if req.provider.is_none() {
            match order_list {
                Some(list) => {
                    for name in list {
                        if let Some(&p) = topo.provider_index.get(name.as_str()) {
                            if !assigned[p] {
                                assigned[p] = true;
                                slots[p] = Slot {
                                    tier: Some(tier),
                                    excluded: None,
                                };
                            }
                        }
                        tier += 1;
                    }
                    for (p, a) in assigned.iter().enumerate() {
                        if !a {
                            slots[p] = Slot {
                                tier: None,
                                excluded: Some("routing.order"),
                            };
                        }
                    }
                }
                None => {
                    // With priorities, ranking decides across providers; without, the configured
                    // provider order does (seed 000's automatic selection).
                    let rank_across = !req.routing.priorities.is_empty();
                    for p in 0..np {
                        if !assigned[p] {
                            slots[p] = Slot {
                                tier: Some(if rank_across { tier } else { tier + p as u32 }),
                                excluded: None,
                            };
                        }
                    }
                }
            }
        }
        let standby_pos = order_list.and_then(|l| l.iter().position(|e| e == "standby"));
        let standby = match standby_pos {
            Some(pos) => Slot {
                tier: Some(named_tiers + pos as u32),
                excluded: None,
            },
            None if req.routing.standby => Slot {
                tier: Some(u32::MAX / 2),
                excluded: None,
            },
            None => Slot {
                tier: None,
                excluded: Some("routing.standby"),
            },
        };
        let pin = req
            .routing
            .pin_pool
            .as_deref()
            .map(|p| topo.pool_index.get(p).copied());
        let r = &req.routing;
        let mut priorities = Vec::new();
        for p in &r.priorities {
            if !priorities.contains(p) {
                priorities.push(*p);
            }
        }
        Plan {
            topo,
            req,
            ctx,
            slots,
            standby,
            explicit_provider,
            pin,
            regions: req.regions.iter().map(|r| normalize_region(r)).collect(),
            selector: r
                .pool_selector
                .iter()
                .map(|(k, v)| compile_expr(k, Operator::In, std::slice::from_ref(v)))
                .collect(),
            affinity_required: r
                .pool_affinity
                .required
                .iter()
                .map(|e| compile_expr(&e.key, e.operator, &e.values))
                .collect(),
            affinity_preferred: r
                .pool_affinity
                .preferred
                .iter()
                .map(|e| (e.weight as i64, compile_expr(&e.key, e.operator, &e.values)))
                .collect(),
            sandbox_required: r
                .sandbox_affinity
                .required
                .iter()
                .map(|t| {
                    let c = counts(topo, ctx, t.topology, &t.match_labels);
                    // The first sandbox of a group that asks to be near its own kind can go anywhere.
                    let self_match = c.total == 0 && labels_match(&t.match_labels, &req.labels);
                    (c, self_match)
                })
                .collect(),
            anti_required: r
                .sandbox_anti_affinity
                .required
                .iter()
                .map(|t| counts(topo, ctx, t.topology, &t.match_labels))
                .collect(),
            sandbox_preferred: r
                .sandbox_affinity
                .preferred
                .iter()
                .map(|t| {
                    (
                        t.weight as i64,
                        counts(topo, ctx, t.topology, &t.match_labels),
                    )
                })
                .collect(),
            anti_preferred: r
                .sandbox_anti_affinity
                .preferred
                .iter()
                .map(|t| {
                    (
                        t.weight as i64,
                        counts(topo, ctx, t.topology, &t.match_labels),
                    )
                })
                .collect(),
            spread: r
                .spread
                .iter()
                .map(|t| {
                    (
                        t.max_skew,
                        t.mode,
                        t.weight as i64,
                        counts(topo, ctx, t.topology, &t.match_labels),
                    )
                })
                .collect(),
            priorities,
            pre: Prefilter::new(topo, req),
        }
    }

    /// Cheap rejections from the packed record; `false` means "certainly ineligible", `true`
    /// means "run the full check".
    fn may_pass(&self, i: usize) -> bool {
        let h = &self.topo.hot[i];
        let pre = &self.pre;
        if pre.impossible {
            return false;
        }
        let slot = if h.standby {
            self.standby
        } else {
            self.slots[h.provider as usize]
        };
        if slot.excluded.is_some() {
            return false;
        }
        if let Some(pin) = self.pin {
            if pin != Some(i) {
                return false;
            }
        }
        let explicit =
            self.explicit_provider == Some(h.provider as usize) || self.pin == Some(Some(i));
        let need = if explicit {
            pre.need_explicit
        } else {
            pre.need_auto
        };
        if h.mask & need != need {
            return false;
        }
        if let Some(ok) = &pre.iso_ok {
            if !ok[h.iso_set as usize] {
                return false;
            }
        }
        if let Some(ok) = &pre.region_ok {
            if h.region == NONE_ID || !ok[h.region as usize] {
                return false;
            }
        }
        if let Some(v) = pre.vpc {
            if v == NONE_ID || h.vpc != v {
                return false;
            }
        }
        let res = &self.req.resources;
        if res.cpu.is_some_and(|c| c > 0.0 && c > h.cpu)
            || res.memory_mb.is_some_and(|m| m > h.memory_mb)
            || res.disk_gb.is_some_and(|d| d > h.disk_gb)
            || res.pids.is_some_and(|n| n > h.pids)
        {
            return false;
        }
        true
    }

    fn slot(&self, pool: &Pool) -> Slot {
        if pool.standby {
            self.standby
        } else {
            self.slots[pool.provider]
        }
    }

    /// The caller named this pool's provider or pinned the pool: only what it asked for applies.
    /// Whether pool `i` is exempt from the portable baseline: only an explicitly named
    /// provider is (seed 000: "Explicit providers only need what you request"). A pin is not:
    /// for a pinned pool "capability, capacity and authorization checks still apply"
    /// (seed 001), so it keeps the baseline unless the request opts out.
    fn explicit(&self, i: usize) -> bool {
        let pool = &self.topo.pools[i];
        self.explicit_provider == Some(pool.provider)
    }

    fn label_match(&self, pool: &Pool, key: &str, pred: impl Fn(&str) -> bool) -> Option<bool> {
        let topo = self.topo;
        let one = |v: Option<&str>| v.map(&pred);
        match key {
            "pool" => Some(pred(&pool.name)),
            "provider" => Some(pred(&topo.providers[pool.provider].name)),
            "provider_kind" => Some(pred(topo.providers[pool.provider].kind.as_str())),
            "account" => Some(pred(&topo.accounts[pool.account].name)),
            "geography" => one(pool.geography.as_deref()),
            "region" => one(pool.region.as_deref()),
            "zone" => one(pool.zone.as_deref()),
            "vpc" => one(pool.vpc.as_deref()),
            "egress" => Some(pred(pool.capabilities.egress.as_str())),
            "isolation" => {
                let modes = &pool.capabilities.isolation;
                (!modes.is_empty()).then(|| modes.iter().filter_map(|m| m.kind_name()).any(&pred))
            }
            k => match k.strip_prefix("account.") {
                Some(ak) => one(topo.accounts[pool.account]
                    .labels
                    .get(ak)
                    .map(String::as_str)),
                None => one(pool.labels.get(k).map(String::as_str)),
            },
        }
    }

    fn expr_matches(&self, pool: &Pool, e: &Expr) -> bool {
        let found = self.label_match(pool, &e.key, |v| e.values.iter().any(|w| w == v));
        match e.op {
            Operator::In => found == Some(true),
            Operator::NotIn => found != Some(true),
            Operator::Exists => found.is_some(),
            Operator::DoesNotExist => found.is_none(),
        }
    }

    /// Every hard requirement except hard spread (which depends on the surviving set).
    fn check(&self, i: usize, out: &mut Vec<Unmet>, first_only: bool) {
        macro_rules! unmet {
            ($u:expr) => {{
                out.push($u);
                if first_only {
                    return;
                }
            }};
        }
        let topo = self.topo;
        let req = self.req;
        let pool = &topo.pools[i];
        let caps = &pool.capabilities;
        if let Some(path) = self.slot(pool).excluded {
            unmet!(Unmet::Path(path));
        }
        if let Some(pin) = self.pin {
            if pin != Some(i) {
                unmet!(Unmet::Path("routing.pin_pool"));
            }
        }
        let source_unmet = match &req.source {
            None => None,
            Some(Source::Environment(e)) => {
                (!caps.environments.iter().any(|x| x == e)).then_some("source.environment")
            }
            Some(Source::Image(_)) => (!caps.image).then_some("source.image"),
            Some(Source::Template(t)) => (!caps.template
                || caps.templates.as_ref().is_some_and(|ts| !ts.contains(t)))
            .then_some("source.template"),
        };
        if let Some(path) = source_unmet {
            unmet!(Unmet::Path(path));
        }
        let res = &req.resources;
        let lim = &pool.resources;
        if let Some(cpu) = res.cpu {
            if cpu > 0.0 && lim.cpu.is_none_or(|l| cpu > l) {
                unmet!(Unmet::Path("resources.cpu"));
            }
        }
        if let Some(m) = res.memory_mb {
            if m > 0 && lim.memory_mb.is_none_or(|l| m > l) {
                unmet!(Unmet::Path("resources.memory_mb"));
            }
        }
        if let Some(d) = res.disk_gb {
            if d > 0 && lim.disk_gb.is_none_or(|l| d > l) {
                unmet!(Unmet::Path("resources.disk_gb"));
            }
        }
        if let Some(n) = res.pids {
            if n > 0 && lim.pids.is_none_or(|l| n > l) {
                unmet!(Unmet::Path("resources.pids"));
            }
        }
        let gpus = res.gpu.unwrap_or(0).max(u32::from(res.gpu_type.is_some()));
        if gpus > 0 && lim.gpu.unwrap_or(0) < gpus {
            unmet!(Unmet::Path("resources.gpu"));
        }
        if let Some(t) = &res.gpu_type {
            if !lim.gpu_types.contains(t) {
                unmet!(Unmet::Path("resources.gpu_type"));
            }
        }
        let f = &req.features;
        if let Some(iso) = &f.isolation {
            if !caps.isolation.iter().any(|m| iso.is_satisfied_by(m)) {
                unmet!(Unmet::Path("features.isolation"));
            }
        }
        let baseline = !self.explicit(i);
        let need = |v: Option<bool>, base: bool| v.unwrap_or(base);
        let checks: [(Option<bool>, bool, bool, &'static str); 9] = [
            (
                f.process.execute,
                baseline,
                caps.process.execute,
                "features.process.execute",
            ),
            (
                f.process.ordered_output,
                false,
                caps.process.ordered_output,
                "features.process.ordered_output",
            ),
            (
                f.process.cancel,
                false,
                caps.process.cancel,
                "features.process.cancel",
            ),
            (
                f.filesystem.read,
                baseline,
                caps.filesystem.read,
                "features.filesystem.read",
            ),
            (
                f.filesystem.write,
                baseline,
                caps.filesystem.write,
                "features.filesystem.write",
            ),
            (
                f.filesystem.list,
                false,
                caps.filesystem.list,
                "features.filesystem.list",
            ),
            (
                f.filesystem.delete,
                false,
                caps.filesystem.delete,
                "features.filesystem.delete",
            ),
            (
                f.filesystem.append,
                false,
                caps.filesystem.append,
                "features.filesystem.append",
            ),
            (
                f.filesystem.mkdir,
                false,
                caps.filesystem.mkdir,
                "features.filesystem.mkdir",
            ),
        ];
        for (v, base, has, path) in checks {
            if need(v, base) && !has {
                unmet!(Unmet::Path(path));
            }
        }
        let more: [(Option<bool>, bool, &'static str); 3] = [
            (f.public_ports, caps.public_ports, "features.public_ports"),
            (f.pause_resume, caps.pause_resume, "features.pause_resume"),
            (f.pty, caps.pty, "features.pty"),
        ];
        for (v, has, path) in more {
            if v == Some(true) && !has {
                unmet!(Unmet::Path(path));
            }
        }
        let net = &req.network;
        if !caps.egress.enforces() {
            if !net.allow_domains.is_empty() {
                unmet!(Unmet::Path("network.allow_domains"));
            }
            if net.deny_all {
                unmet!(Unmet::Path("network.deny_all"));
            }
            if !net.cidrs.is_empty() {
                unmet!(Unmet::Path("network.cidrs"));
            }
        }
        if let Some(vpc) = &net.vpc {
            if pool.vpc.as_ref() != Some(vpc) {
                unmet!(Unmet::Path("network.vpc"));
            }
        }
        if !self.regions.is_empty()
            && pool
                .region
                .as_deref()
                .is_none_or(|r| !self.regions.iter().any(|x| x == r))
        {
            unmet!(Unmet::Path("regions"));
        }
        for e in &self.selector {
            if !self.expr_matches(pool, e) {
                unmet!(Unmet::Key("routing.pool_selector", e.key.clone()));
            }
        }
        for (j, e) in self.affinity_required.iter().enumerate() {
            if !self.expr_matches(pool, e) {
                unmet!(Unmet::Index("routing.pool_affinity.required", j));
            }
        }
        for (j, (c, self_match)) in self.sandbox_required.iter().enumerate() {
            let near = *self_match || c.at(domain(topo, pool, c.key)).is_some_and(|n| n > 0);
            if !near {
                unmet!(Unmet::Index("routing.sandbox_affinity.required", j));
            }
        }
        for (j, c) in self.anti_required.iter().enumerate() {
            // An unknown domain cannot prove separation.
            if c.at(domain(topo, pool, c.key)) != Some(0) {
                unmet!(Unmet::Index("routing.sandbox_anti_affinity.required", j));
            }
        }
    }

    /// Minimum matching count over the domains of `survivors`, per spread term.
    fn spread_minimums(&self, survivors: &[usize]) -> Vec<Option<u32>> {
        self.spread
            .iter()
            .map(|(_, mode, _, c)| {
                if *mode != SpreadMode::Hard {
                    return None;
                }
                survivors
                    .iter()
                    .filter_map(|&i| c.at(domain(self.topo, &self.topo.pools[i], c.key)))
                    .min()
            })
            .collect()
    }

    fn spread_unmet(&self, i: usize, mins: &[Option<u32>], out: &mut Vec<Unmet>) {
        let pool = &self.topo.pools[i];
        for (j, ((max_skew, mode, _, c), min)) in self.spread.iter().zip(mins).enumerate() {
            if *mode != SpreadMode::Hard {
                continue;
            }
            let ok = match (c.at(domain(self.topo, pool, c.key)), min) {
                (Some(n), Some(min)) => i64::from(n) + 1 - i64::from(*min) <= i64::from(*max_skew),
                (Some(_), None) => true,
                (None, _) => false,
            };
            if !ok {
                out.push(Unmet::Index("routing.spread", j));
            }
        }
    }

    fn soft_score(&self, pool: &Pool) -> i64 {
        let topo = self.topo;
        let mut s = 0i64;
        for (w, e) in &self.affinity_preferred {
            if self.expr_matches(pool, e) {
                s += w;
            }
        }
        for (w, c) in &self.sandbox_preferred {
            if c.at(domain(topo, pool, c.key)).is_some_and(|n| n > 0) {
                s += w;
            }
        }
        for (w, c) in &self.anti_preferred {
            if c.at(domain(topo, pool, c.key)) == Some(0) {
                s += w;
            }
        }
        for (_, mode, w, c) in &self.spread {
            if *mode == SpreadMode::Soft {
                // Unknown domain counts as the most crowded: it cannot be shown to balance anything.
                s -= w * c.at(domain(topo, pool, c.key)).unwrap_or(c.total) as i64;
            }
        }
        s
    }

    fn free_capacity(&self, pool: &Pool) -> Option<u64> {
        self.ctx
            .free_capacity
            .get(&*pool.name)
            .copied()
            .or(pool.capacity)
    }

    fn metric(&self, pool: &Pool, p: Priority) -> Option<f64> {
        self.metric_with(pool, p, self.ctx.stats.get(&*pool.name))
    }

    fn metric_with(&self, pool: &Pool, p: Priority, stats: Option<&PoolStats>) -> Option<f64> {
        let v = match p {
            Priority::Price => pool.price,
            Priority::StartupLatency => stats.and_then(|s| s.median_startup_latency_ms()),
            Priority::CreationSuccess => stats.and_then(|s| s.creation_success()),
        };
        v.filter(|v| v.is_finite())
    }

    fn width(&self, p: Priority) -> f64 {
        let b = &self.ctx.bands;
        let w = match p {
            Priority::Price => b.price,
            Priority::StartupLatency => b.startup_latency_ms,
            Priority::CreationSuccess => b.creation_success,
        };
        if w.is_finite() && w > 0.0 {
            w
        } else {
            0.0
        }
    }

    fn rank_key(&self, p: Priority, v: Option<f64>) -> (u64, Option<i64>) {
        let Some(v) = v else { return (u64::MAX, None) };
        let higher_better = p == Priority::CreationSuccess;
        let w = self.width(p);
        if w > 0.0 {
            let b = band_of(v, w, higher_better);
            ((b as u64) ^ (1 << 63), Some(b))
        } else {
            (ordered(if higher_better { -v } else { v }), None)
        }
    }

    fn sort_key(&self, i: usize) -> [u64; 7] {
        let pool = &self.topo.pools[i];
        let mut k = [0u64; 7];
        k[0] = self.slot(pool).tier.unwrap_or(u32::MAX) as u64;
        // One lookup per pool, and none when no measured priority is requested.
        let measured = self.priorities.iter().any(|p| *p != Priority::Price);
        let stats = if measured {
            self.ctx.stats.get(&*pool.name)
        } else {
            None
        };
        for (j, p) in self.priorities.iter().enumerate() {
            k[1 + j] = self.rank_key(*p, self.metric_with(pool, *p, stats)).0;
        }
        k[4] = ((-self.soft_score(pool)) as u64) ^ (1 << 63);
        k[5] = match self.free_capacity(pool) {
            Some(f) => u64::MAX - 1 - f.min(u64::MAX - 2),
            None => u64::MAX,
        };
        k[6] = pool.name_rank as u64;
        k
    }

    fn candidate(&self, i: usize) -> Candidate {
        let pool = &self.topo.pools[i];
        Candidate {
            pool: pool.name.clone(),
            provider: self.topo.providers[pool.provider].name.clone(),
            account: self.topo.accounts[pool.account].name.clone(),
            region: pool.region.clone(),
            zone: pool.zone.clone(),
            standby: pool.standby,
            baseline: !self.explicit(i),
        }
    }

    /// Phase 1 survivors, then hard spread over them.
    fn eligible(&self) -> Vec<usize> {
        let mut buf = Vec::new();
        let mut survivors = Vec::new();
        for i in 0..self.topo.pools.len() {
            if !self.may_pass(i) {
                continue;
            }
            buf.clear();
            self.check(i, &mut buf, true);
            if buf.is_empty() {
                survivors.push(i);
            }
        }
        if self.spread.iter().any(|t| t.1 == SpreadMode::Hard) {
            let mins = self.spread_minimums(&survivors);
            survivors.retain(|&i| {
                buf.clear();
                self.spread_unmet(i, &mins, &mut buf);
                buf.is_empty()
            });
        }
        survivors
    }

    fn order(&self, eligible: &[usize]) -> Vec<usize> {
        let mut keyed: Vec<([u64; 7], usize)> =
            eligible.iter().map(|&i| (self.sort_key(i), i)).collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, i)| i).collect()
    }

    /// Full unmet lists for every pool, in configuration order.
    fn all_unmet(&self) -> Vec<Vec<Unmet>> {
        let n = self.topo.pools.len();
        let mut lists: Vec<Vec<Unmet>> = (0..n)
            .map(|i| {
                let mut v = Vec::new();
                self.check(i, &mut v, false);
                v
            })
            .collect();
        if self.spread.iter().any(|t| t.1 == SpreadMode::Hard) {
            let survivors: Vec<usize> = (0..n).filter(|&i| lists[i].is_empty()).collect();
            let mins = self.spread_minimums(&survivors);
            for (i, l) in lists.iter_mut().enumerate() {
                self.spread_unmet(i, &mins, l);
            }
        }
        lists
    }

    /// Every pool with its unmet requirements; with a pin on an existing pool, that pool
    /// only (the others' one reason, "not the pinned pool", explains nothing).
    fn no_eligible(&self, lists: &[Vec<Unmet>]) -> NoEligible {
        let attempts = lists
            .iter()
            .enumerate()
            .filter(|(i, _)| !matches!(self.pin, Some(Some(p)) if p != *i))
            .map(|(i, l)| {
                let pool = &self.topo.pools[i];
                Attempt {
                    provider: self.topo.providers[pool.provider].name.to_string(),
                    pool: pool.name.to_string(),
                    unmet_requirements: l.iter().map(Unmet::render).collect(),
                }
            })
            .collect();
        NoEligible::new(attempts)
    }
}

/// Filters the configured pools by the request's hard requirements, orders the survivors, and
/// returns them as failover candidates; see the crate docs for the contract.
pub fn route(
    topology: &Topology,
    request: &Request,
    ctx: &RouteContext,
) -> Result<Route, NoEligible> {
    let plan = Plan::new(topology, request, ctx);
    let eligible = plan.eligible();
    if eligible.is_empty() {
        return Err(plan.no_eligible(&plan.all_unmet()));
    }
    let candidates = plan
        .order(&eligible)
        .into_iter()
        .map(|i| plan.candidate(i))
        .collect();
    Ok(Route { candidates })
}

/// Every pool with its unmet requirements, rank keys and band values, and the final order.
/// `explain(..).order` always equals the pools of `route(..)` for the same inputs.
pub fn explain(topology: &Topology, request: &Request, ctx: &RouteContext) -> Explanation {
    route_explained(topology, request, ctx).1
}

/// [`route`] and [`explain`] from one evaluation: the create engine keeps the explanation as
/// the sandbox's placement record, so the record is, by construction, what produced its
/// candidate list (not a second evaluation that could see other inputs).
pub fn route_explained(
    topology: &Topology,
    request: &Request,
    ctx: &RouteContext,
) -> (Result<Route, NoEligible>, Explanation) {
    let plan = Plan::new(topology, request, ctx);
    let lists = plan.all_unmet();
    let eligible: Vec<usize> = (0..topology.pools.len())
        .filter(|&i| lists[i].is_empty())
        .collect();
    let order = plan.order(&eligible);
    let route = if order.is_empty() {
        Err(plan.no_eligible(&lists))
    } else {
        Ok(Route {
            candidates: order.iter().map(|&i| plan.candidate(i)).collect(),
        })
    };
    (route, explanation(&plan, &lists, &order, None))
}

/// As [`route_explained`], at [`route`]'s cost: the explanation covers every candidate (all
/// of its ranking inputs) but only the first `ineligible_limit` ineligible pools in
/// configuration order, with `ineligible_omitted` counting the rest. Explaining why each of
/// ten thousand pools does not qualify costs ~80 times the route itself (`cargo bench -p
/// sandgate-router`), too much for every create; when no pool qualifies, every pool is
/// explained, as the refusal lists them all anyway.
///
/// An ineligible pool that passes every requirement on its own was removed by a hard
/// `routing.spread` term; it is reported as `routing.spread`.
pub fn route_recorded(
    topology: &Topology,
    request: &Request,
    ctx: &RouteContext,
    ineligible_limit: usize,
) -> (Result<Route, NoEligible>, Explanation) {
    let plan = Plan::new(topology, request, ctx);
    let eligible = plan.eligible();
    if eligible.is_empty() {
        let lists = plan.all_unmet();
        return (
            Err(plan.no_eligible(&lists)),
            explanation(&plan, &lists, &[], None),
        );
    }
    let order = plan.order(&eligible);
    let n = topology.pools.len();
    let mut shown = vec![false; n];
    for &i in &eligible {
        shown[i] = true;
    }
    let mut lists: Vec<Vec<Unmet>> = vec![Vec::new(); n];
    let mut sampled = 0;
    for i in 0..n {
        if shown[i] || sampled == ineligible_limit {
            continue;
        }
        plan.check(i, &mut lists[i], false);
        if lists[i].is_empty() {
            lists[i].push(Unmet::Path("routing.spread"));
        }
        shown[i] = true;
        sampled += 1;
    }
    let route = Route {
        candidates: order.iter().map(|&i| plan.candidate(i)).collect(),
    };
    (Ok(route), explanation(&plan, &lists, &order, Some(&shown)))
}

/// The explanation of the pools `shown` marks (every pool when `None`).
fn explanation(
    plan: &Plan<'_>,
    lists: &[Vec<Unmet>],
    order: &[usize],
    shown: Option<&[bool]>,
) -> Explanation {
    let (topology, request, ctx) = (plan.topo, plan.req, plan.ctx);
    let mut position = vec![None; topology.pools.len()];
    for (pos, &i) in order.iter().enumerate() {
        position[i] = Some(pos);
    }
    let is_shown = |i: usize| shown.is_none_or(|s| s[i]);
    let pools = topology
        .pools
        .iter()
        .enumerate()
        .filter(|(i, _)| is_shown(*i))
        .map(|(i, pool)| {
            let stats = ctx.stats.get(&*pool.name);
            PoolExplanation {
                pool: pool.name.clone(),
                provider: topology.providers[pool.provider].name.clone(),
                account: topology.accounts[pool.account].name.clone(),
                region: pool.region.clone(),
                zone: pool.zone.clone(),
                standby: pool.standby,
                eligible: lists[i].is_empty(),
                unmet_requirements: lists[i].iter().map(Unmet::render).collect(),
                baseline_applied: !plan.explicit(i),
                tier: plan.slot(pool).tier,
                rank: plan
                    .priorities
                    .iter()
                    .map(|&p| {
                        let value = plan.metric(pool, p);
                        RankKey {
                            priority: p,
                            value,
                            band: plan.rank_key(p, value).1,
                        }
                    })
                    .collect(),
                metrics: Metrics {
                    price: pool.price,
                    startup_latency_ms: plan.metric(pool, Priority::StartupLatency),
                    startup_latency_samples: stats.map_or(0, |s| s.startup_latency_ms.len()),
                    creation_success: plan.metric(pool, Priority::CreationSuccess),
                    attempts: stats.map_or(0, |s| s.attempts),
                },
                soft_score: plan.soft_score(pool),
                free_capacity: plan.free_capacity(pool),
                position: position[i],
            }
        })
        .collect();
    let automatic = request.provider.is_none();
    Explanation {
        automatic,
        baseline: vec![
            "features.process.execute",
            "features.filesystem.read",
            "features.filesystem.write",
        ]
        .into_iter()
        .zip([
            request.features.process.execute,
            request.features.filesystem.read,
            request.features.filesystem.write,
        ])
        .filter(|(_, v)| v.is_none())
        .map(|(p, _)| p)
        .collect(),
        priorities: plan.priorities.clone(),
        bands: ctx.bands,
        order: order
            .iter()
            .map(|&i| topology.pools[i].name.clone())
            .collect(),
        error: order.is_empty().then(|| plan.no_eligible(lists)),
        ineligible_omitted: (0..topology.pools.len()).filter(|&i| !is_shown(i)).count(),
        pools,
    }
}

/// Hard-requirement filter alone (no ranking or placement ordering): the benchmark baseline.
#[doc(hidden)]
pub fn filter_only(topology: &Topology, request: &Request, ctx: &RouteContext) -> usize {
    Plan::new(topology, request, ctx).eligible().len()
}
