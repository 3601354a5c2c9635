//! sandgate's placement router: a pure, synchronous function from (topology, request, measured
//! context) to an ordered list of pools to try.
//!
//! Purity is the point: creation failover, `POST /v1/routes:explain` and `sandgate route explain`
//! must all see the *same* answer for the same inputs, and property tests can only pin down a
//! function that reads nothing but its arguments. The caller owns clocks, stores and metrics and
//! hands their current values in through [`RouteContext`].
//!
//! # Contract
//!
//! **Model.** [`RouterConfig`] is `[[providers]]`, `[[accounts]]`, `[[pools]]`. A provider's
//! declared capabilities start from seed 000's tables ([`ProviderKind::builtin_capabilities`]) and
//! can be overridden; a pool can only narrow its provider's capabilities (validation refuses a
//! pool that claims more), because a pool cannot make a provider's adapter do something it
//! cannot. [`RouterConfig::validate`] reports every error with its key path, e.g.
//! `pools[2].account: unknown account "acct-x"`. An account must belong to its pool's provider:
//! a pool never borrows another account's authority.
//!
//! **Hard requirements** filter; a preference never relaxes one. Unmet requirements are reported
//! as the request's own field paths:
//! `source.environment|image|template`, `resources.cpu|memory_mb|disk_gb|pids|gpu|gpu_type`,
//! `features.isolation` (one complete mode of the pool must carry every requested property),
//! `features.process.*`, `features.filesystem.*`, `features.public_ports`,
//! `features.pause_resume`, `features.pty`, `network.allow_domains|deny_all|cidrs` (only pools
//! whose egress enforcement is `native` or `gateway`; `advisory` is bypassable and never
//! counts), `network.vpc`, `regions` (only pools that declare a region in the list, compared
//! after [`normalize_region`]), `provider` / `routing.order` / `routing.standby` (the order
//! excludes the pool), `routing.pin_pool`, `routing.pool_selector.<key>`,
//! `routing.pool_affinity.required[i]`, `routing.sandbox_affinity.required[i]`,
//! `routing.sandbox_anti_affinity.required[i]`, `routing.spread[i]` (hard spread).
//! Undeclared means unsupported: a pool without a memory limit cannot satisfy `memory_mb`, a
//! provider with unknown isolation (Northflank) never satisfies `features.isolation`, no built-in
//! provider declares `pty`. Failing closed is the only safe reading of "declared capabilities".
//!
//! **Portable baseline.** Every candidate except the pools of the explicit `provider` (and a
//! pinned pool) must also support `process.execute`, `filesystem.read` and `filesystem.write`,
//! unless the request sets them to `false`. This is why automatic routing never selects the
//! lifecycle-only CodeSandbox and Northflank adapters, while naming them explicitly still works.
//!
//! **Order.** Candidates are grouped into tiers, then ranked within a tier:
//! 1. the explicit `provider`, then `fallback_providers` in order (duplicates dropped);
//! 2. with an explicit `provider`, nothing else (other providers are unmet `provider`);
//!    otherwise automatic selection continues with the order in force: `routing.order` when it
//!    is a list, else the workspace Auto order ([`RouteContext::workspace_order`]), else the
//!    configured provider order. A provider omitted from an explicit or workspace order is not
//!    used. An explicit order is never re-sorted by price: each entry is its own tier. Only when
//!    no order is given and `routing.priorities` is non-empty do all remaining providers share one
//!    tier, so that ranking ("lowest cost in US East") can compare across providers.
//! 3. pools flagged `standby` are used only when the order in force contains `"standby"` (at that
//!    position) or `routing.standby` is true (last), and only if they satisfy the request.
//!
//! **Ranking** within a tier, lexicographically: each of `routing.priorities` in the given order
//! (`price` lower, `startup_latency` median of samples lower, `creation_success` =
//! successes/attempts higher), compared by band `floor(value / width)` ([`Bands`]; width `0`
//! compares exactly), a pool without a value after every pool with one; then the soft score
//! (weights of matching preferred pool-affinity, sandbox-affinity and anti-affinity terms, minus
//! weight × matching sandboxes in the pool's domain for each soft spread term), higher first;
//! then free capacity ([`RouteContext::free_capacity`], else configured `capacity`), larger
//! first, unknown last; then pool name. Bands are absolute, not relative to the best pool, so
//! that removing a pool can never reorder the others.
//!
//! **Placement.** `pin_pool` leaves at most one candidate and still applies every requirement.
//! `pool_selector` and `pool_affinity.required` filter over pool labels plus derived keys
//! (`pool`, `provider`, `provider_kind`, `account`, `account.<label>`, `geography`, `region`,
//! `zone`, `isolation`, `egress`, `vpc`). Sandbox affinity needs a matching existing sandbox in
//! the pool's domain (`provider`, `region` or `zone`); when none matches anywhere and the new
//! sandbox's own labels match, the first of a group may go anywhere. Anti-affinity needs a known
//! domain with no matching sandbox. Hard spread keeps pools where
//! `matching_in_domain + 1 - min_over_eligible_domains <= max_skew`.
//!
//! **Capacity and authorization** are admission checks made by the create engine when it reaches
//! each candidate, against live values; routing only uses free capacity to break ties.
//!
//! **Result.** [`route`] returns the ordered [`Route`] or [`NoEligible`] (`code =
//! "no_eligible_provider"`, `details.attempts[] = {provider, pool, unmet_requirements}` for every
//! configured pool). [`explain`] returns an [`Explanation`] whose `order` equals `route`'s.

mod config;
mod context;
mod engine;
mod error;
mod request;

pub use config::{
    normalize_region, Account, AccountConfig, BillingStanding, Capabilities, CapabilitiesConfig,
    ConfigError, ConfigErrors, EgressEnforcement, FeaturesConfig, FilesystemCapabilities,
    FilesystemConfig, IsolationMode, Pool, PoolConfig, PoolResources, ProcessCapabilities,
    ProcessConfig, Provider, ProviderConfig, ProviderKind, RouterConfig, SourcesConfig, Topology,
    PORTABLE_ENVIRONMENTS, RESERVED_LABEL_KEYS,
};
pub use context::{Bands, ExistingSandbox, PoolStats, RouteContext};
#[doc(hidden)]
pub use engine::filter_only;
pub use engine::{
    explain, route, route_explained, route_recorded, Candidate, Explanation, Metrics,
    PoolExplanation, RankKey, Route,
};
pub use error::{Attempt, NoEligible, NoEligibleDetails, NO_ELIGIBLE_PROVIDER};
pub use request::{
    check_text, AutoKeyword, Features, FilesystemFeatures, InvalidField, LabelExpr, Network,
    Operator, Order, PoolAffinity, Priority, ProcessFeatures, Request, Resources, Routing,
    SandboxAffinity, SandboxTerm, Source, SpreadMode, SpreadTerm, TopologyKey, WeightedLabelExpr,
    WeightedSandboxTerm, MAX_CPU, MAX_DISK_GB, MAX_ENTRIES, MAX_GPU, MAX_MEMORY_MB, MAX_NAME_BYTES,
    MAX_SOURCE_BYTES, MAX_VALUE_BYTES, MAX_WEIGHT,
};
