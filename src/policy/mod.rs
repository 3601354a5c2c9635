//! Rego policy (regorus): loading, generations, hot reload and evaluation.
//!
//! Contract:
//! - Every `.rego` file (except `*_test.rego`) and every `data.json` under the policy
//!   directory is loaded; a `data.json` in `a/b/` is mounted at `data.a.b` (OPA's bundle
//!   layout).
//! - Each layer is one package, `sandgate.<layer>`. Its decision is `allow` (default false),
//!   a set `deny` of reason strings, and, for egress, an `action` (`inspect` or `tunnel`).
//!   An operation proceeds only when `allow` is true and `deny` is empty. A layer with no
//!   package loaded denies (default deny).
//! - A loaded set of files is a *generation* with a number. A reload that fails to parse or
//!   compile never replaces the last good generation; the error is kept for `/healthz`.
//! - A changed set of files is loaded only once it has stayed the same for one whole poll
//!   interval, and only if it did not change while being read: an editor or deploy tool
//!   writing files in place is never caught half way (a truncated file can still parse,
//!   and would otherwise be served as a policy nobody wrote).
//! - An evaluation error denies.
//! - The compiled generation is shared; each worker thread keeps its own clone of the
//!   engine (regorus evaluation takes `&mut self`), refreshed when the generation changes,
//!   so nothing is parsed on the request path.
//! - Every evaluation counts in `sandgate_policy_decisions_total{layer, outcome}` and
//!   `sandgate_policy_eval_seconds{layer}`, and, when a decision log is attached
//!   ([`PolicyEngine::set_decision_log`]), writes one OPA-shaped record. Nothing is built for
//!   the log when it is off: the egress path evaluates per request.

pub mod audit;
pub mod input;
mod probe;
pub mod replay;
pub mod scope;
pub mod suggest;
pub mod testing;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use regorus::Value;

pub use crate::base::Layer;
use crate::decision_log::{DecisionLog, Labels, LoggedEval, PolicyMetrics, PolicyRecord};

/// The layers sandgate knows; each has its package `sandgate.<layer>`.
pub const LAYERS: &[&str] = &[
    "egress",
    "credential",
    "creation",
    "provider",
    "lifecycle",
    "action",
];

#[derive(Debug, Clone, thiserror::Error)]
pub enum PolicyError {
    #[error("policy directory {dir}: {reason}")]
    Dir { dir: PathBuf, reason: String },
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
    #[error("policy does not compile: {0}")]
    Compile(String),
    /// A file whose package does not belong to the scope its folder stands for.
    #[error("{file}:{line}: {reason}")]
    Scope {
        file: String,
        line: usize,
        reason: String,
    },
}

/// A layer's verdict.
#[derive(Debug, Clone)]
pub struct Decision {
    /// True only when the layer allowed and denied nothing.
    pub allowed: bool,
    /// Deny reasons; when refused with none given, a default-deny reason.
    pub reasons: Vec<String>,
    /// The egress action (`inspect` unless the policy says otherwise).
    pub action: String,
    /// Egress: how a refusal is answered (`in_tunnel` or `connect`), when the policy's
    /// `deny_mode` rule says (a workspace scope's before the platform's); `None` leaves it
    /// to `[proxy] deny_mode`.
    pub deny_mode: Option<String>,
    pub generation: u64,
    pub eval_time: Duration,
    /// The decision log record's id, when one was written (to correlate a refusal with it).
    pub decision_id: Option<String>,
    /// When refused, the scope that decided: the first with an explicit deny, else the first
    /// that did not allow (`platform`, or `workspaces/<ws>`).
    pub deny_scope: Option<Arc<str>>,
    /// Refused only for want of an `allow` (no `deny` entry, no missing layer, no error):
    /// a fact the input lacked (the egress proxy's resolved address) could still change it.
    pub default_deny: bool,
    /// For a layer whose caller writes its own record (egress), while a log is attached:
    /// what that record must carry to be replayed (id, complete input, the policy's answer).
    pub logged: Option<Arc<LoggedEval>>,
    /// Refusals recorded but not enforced ([`audit`]): non-empty only when `allowed`.
    pub would_deny: Vec<String>,
}

/// The platform scope's name.
pub const PLATFORM_SCOPE: &str = "platform";

struct Generation {
    number: u64,
    /// [`Loaded::digest`] of the files this generation was built from.
    digest: String,
    files: Vec<String>,
    fingerprint: Vec<(String, u64, SystemTime)>,
    engine: regorus::Engine,
    present_layers: Vec<&'static str>,
    /// Bytecode for each layer the RVM compiles: the fast path. A layer the RVM cannot
    /// compile is evaluated by the interpreter through its wrapper module instead.
    programs: HashMap<&'static str, Arc<LayerProgram>>,
    /// `data` for the VMs (the interpreter has it inside its engine).
    data: Value,
    /// Workspace scopes: workspace → layer → its rules (see [`scope`]).
    scoped: HashMap<String, HashMap<&'static str, Arc<ScopeLayer>>>,
    platform_scope: Arc<str>,
    /// Layers and scopes left to the interpreter because the bytecode disagreed.
    fallbacks: Vec<Fallback>,
    /// Layers audited as a whole (`data.sandgate.audit.layers`, see [`audit`]).
    audited: Vec<&'static str>,
}

/// A layer (in a scope) evaluated by the interpreter although bytecode was chosen, because
/// the two disagreed on a probe input at load.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Fallback {
    pub scope: String,
    pub layer: &'static str,
    pub reason: String,
}

impl Fallback {
    fn new(scope: &str, layer: &'static str, reason: String) -> Fallback {
        Fallback {
            scope: scope.to_string(),
            layer,
            reason,
        }
    }
}

/// A layer's rules in one workspace scope.
struct ScopeLayer {
    /// `workspaces/<ws>`.
    name: Arc<str>,
    /// Distinguishes the scope's VMs and wrapper package (`sandgate_internal.s<index>`).
    index: u32,
    /// Whether any of its files declares `allow`: a scope that does not only restricts.
    has_allow: bool,
    program: Option<Arc<LayerProgram>>,
}

struct LayerProgram {
    program: Arc<regorus::rvm::program::Program>,
    /// `None`: the rules define no `allow` (only for workspace scopes; allows).
    allow: Option<String>,
    deny: Option<String>,
    action: Option<String>,
    deny_mode: Option<String>,
    audit: Option<String>,
}

/// One scope's answer before composition.
#[derive(Debug, Clone, PartialEq)]
struct Verdict {
    allow: bool,
    deny: Vec<String>,
    /// `None` when the rules do not set it.
    action: Option<String>,
    /// `None` when the rules do not set it.
    deny_mode: Option<String>,
    /// `audit_deny` reasons: recorded, not enforced ([`audit`]).
    audit: Vec<String>,
}

/// What `/healthz` and the API report about policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyStatus {
    pub generation: u64,
    pub digest: String,
    pub files: Vec<String>,
    pub last_error: Option<String>,
    pub loaded_at_unix: u64,
}

/// `GET /v1/policies`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct PolicyReport {
    /// The generation serving decisions now (a counter local to this replica).
    pub generation: u64,
    /// SHA-256 of the serving generation's files (names and text): equal on two replicas
    /// exactly when they serve the same policy.
    pub digest: String,
    /// When that generation was loaded (RFC 3339).
    pub loaded_at: String,
    pub dir: String,
    #[schema(value_type = String, example = "bytecode")]
    pub evaluator: Evaluator,
    /// Files of the serving generation (`.rego` and `data.json`), relative to `dir`.
    pub files: Vec<String>,
    pub layers: LayerReport,
    /// Workspace scopes (`workspaces/<ws>/`) and the layers each has rules for.
    pub scopes: Vec<ScopeReport>,
    /// With the bytecode evaluator: layers left to the interpreter because the two
    /// disagreed on a probe input when the generation loaded.
    pub fallbacks: Vec<Fallback>,
    /// The newest reload failure, while the files on disk still fail to load; the
    /// generation above keeps serving meanwhile.
    pub last_error: Option<ReloadError>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct LayerReport {
    /// Layers whose package `sandgate.<layer>` is loaded.
    pub present: Vec<&'static str>,
    /// Known layers with no package: every decision of theirs is a default deny.
    pub missing: Vec<&'static str>,
    /// Present layers evaluated by the bytecode VM (the others by the interpreter).
    pub bytecode: Vec<&'static str>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ScopeReport {
    /// `workspaces/<ws>`.
    pub scope: String,
    pub layers: Vec<&'static str>,
    /// Of those, the ones evaluated by the bytecode VM.
    pub bytecode: Vec<&'static str>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ReloadError {
    /// What failed, with `file:line` when the parser knows it.
    pub message: String,
    /// When it was first seen (RFC 3339).
    pub at: String,
}

/// How decisions are computed. Both evaluate the same compiled policy; a differential test
/// keeps them in agreement on the bundled layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Evaluator {
    /// regorus's bytecode VM (RVM), one per worker thread: about ten times faster. A layer
    /// the compiler cannot handle falls back to the interpreter on its own.
    Bytecode,
    /// regorus's tree-walking interpreter, the reference semantics. Choose it if a policy
    /// decides differently under the bytecode VM (please report that).
    Interpreter,
}

pub struct PolicyEngine {
    evaluator: Evaluator,
    dir: PathBuf,
    /// Distinguishes engines in one process (tests run several) in the thread-local cache.
    instance: u64,
    current: RwLock<Arc<Generation>>,
    /// The newest reload failure and when it happened; cleared by the next good load.
    last_error: RwLock<Option<(String, SystemTime)>>,
    /// Fingerprint of files that failed to load, so they are not recompiled every tick.
    rejected: RwLock<Option<Vec<(String, u64, SystemTime)>>>,
    /// A changed fingerprint seen at the previous poll, waiting to be seen unchanged again.
    settling: RwLock<Option<Vec<(String, u64, SystemTime)>>>,
    loaded_at: RwLock<SystemTime>,
    next_generation: AtomicU64,
    /// Where decisions are logged, set once by the server (tools and tests run without).
    log: OnceLock<EngineLog>,
}

struct EngineLog {
    log: DecisionLog,
    /// Layers whose caller writes its own, richer record (egress: the proxy).
    skip: &'static [&'static str],
}

impl std::fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("dir", &self.dir)
            .field("generation", &self.generation())
            .finish()
    }
}

static INSTANCES: AtomicU64 = AtomicU64::new(1);

/// (engine instance, layer, scope: 0 for the platform, else a workspace scope's index).
type VmKey = (u64, &'static str, u32);

thread_local! {
    static WORKER_ENGINES: RefCell<HashMap<u64, (u64, regorus::Engine)>> = RefCell::new(HashMap::new());
    static WORKER_VMS: RefCell<HashMap<VmKey, (u64, regorus::rvm::RegoVM)>> = RefCell::new(HashMap::new());
}

impl PolicyEngine {
    /// Loads the directory; an error here is a startup error (there is no last good policy).
    pub fn load(dir: &Path) -> Result<PolicyEngine, PolicyError> {
        PolicyEngine::load_with(dir, Evaluator::Bytecode)
    }

    /// Loads with an explicit evaluator (`[policy] evaluator`).
    pub fn load_with(dir: &Path, evaluator: Evaluator) -> Result<PolicyEngine, PolicyError> {
        let generation = build_generation(dir, 1, evaluator)?;
        Ok(PolicyEngine {
            evaluator,
            dir: dir.to_path_buf(),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            current: RwLock::new(Arc::new(generation)),
            last_error: RwLock::new(None),
            rejected: RwLock::new(None),
            settling: RwLock::new(None),
            loaded_at: RwLock::new(SystemTime::now()),
            next_generation: AtomicU64::new(2),
            log: OnceLock::new(),
        })
    }

    /// Logs every decision of every layer except `skip` (whose callers log their own) to
    /// `log`. Set once; later calls are ignored.
    pub fn set_decision_log(&self, log: DecisionLog, skip: &'static [&'static str]) {
        let _ = self.log.set(EngineLog { log, skip });
    }

    /// The log to write `layer`'s decisions to, if any: checked before anything is built.
    fn log_for(&self, layer: &str) -> Option<&DecisionLog> {
        self.log
            .get()
            .filter(|l| l.log.enabled() && !l.skip.contains(&layer))
            .map(|l| &l.log)
    }

    /// The log `layer`'s caller writes its decisions to, when it writes its own.
    fn caller_log_for(&self, layer: &str) -> Option<&DecisionLog> {
        self.log
            .get()
            .filter(|l| l.log.enabled() && l.skip.contains(&layer))
            .map(|l| &l.log)
    }

    /// Hands a decision of a layer whose caller logs it what the caller's record needs.
    fn keep_for_caller(
        &self,
        log: &DecisionLog,
        layer: &'static str,
        decision: &mut Decision,
        input: &Value,
    ) {
        let logged = Arc::new(logged_eval(log, layer, decision, input));
        decision.decision_id = Some(logged.decision_id.clone());
        decision.logged = Some(logged);
    }

    pub fn generation(&self) -> u64 {
        self.current().number
    }

    fn current(&self) -> Arc<Generation> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn status(&self) -> PolicyStatus {
        let current = self.current();
        PolicyStatus {
            generation: current.number,
            digest: current.digest.clone(),
            files: current.files.clone(),
            last_error: self
                .last_error
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|(text, _)| text.clone()),
            loaded_at_unix: self
                .loaded_at
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// Everything `GET /v1/policies` shows: what is loaded and serving, and what failed.
    pub fn report(&self) -> PolicyReport {
        let current = self.current();
        let rfc3339 = crate::base::clock::rfc3339;
        let last_error = self
            .last_error
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(message, at)| ReloadError {
                message: message.clone(),
                at: rfc3339(*at),
            });
        let loaded_at = *self.loaded_at.read().unwrap_or_else(|e| e.into_inner());
        let mut bytecode: Vec<&'static str> = current.programs.keys().copied().collect();
        bytecode.sort_by_key(|l| LAYERS.iter().position(|x| x == l));
        PolicyReport {
            generation: current.number,
            digest: current.digest.clone(),
            loaded_at: rfc3339(loaded_at),
            dir: self.dir.display().to_string(),
            evaluator: self.evaluator,
            files: current.files.clone(),
            layers: LayerReport {
                present: current.present_layers.clone(),
                missing: LAYERS
                    .iter()
                    .copied()
                    .filter(|l| !current.present_layers.contains(l))
                    .collect(),
                bytecode,
            },
            scopes: {
                let mut scopes: Vec<ScopeReport> = current
                    .scoped
                    .values()
                    .filter_map(|layers| {
                        let name = layers.values().next()?.name.to_string();
                        let mut present: Vec<&'static str> = layers.keys().copied().collect();
                        present.sort_by_key(|l| LAYERS.iter().position(|x| x == l));
                        let bytecode = present
                            .iter()
                            .copied()
                            .filter(|l| layers[l].program.is_some())
                            .collect();
                        Some(ScopeReport {
                            scope: name,
                            layers: present,
                            bytecode,
                        })
                    })
                    .collect();
                scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
                scopes
            },
            fallbacks: current.fallbacks.clone(),
            last_error,
        }
    }

    /// Reloads when the files changed. Returns the new generation number when one loaded.
    /// A failure is recorded and logged; the last good generation keeps serving.
    pub fn reload_if_changed(&self) -> Option<u64> {
        let current = self.current();
        let fingerprint = match fingerprint(&self.dir) {
            Ok(f) => f,
            Err(e) => {
                self.record_failure(e);
                return None;
            }
        };
        if fingerprint == current.fingerprint {
            return None;
        }
        if self
            .rejected
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            == Some(&fingerprint)
        {
            return None;
        }
        {
            let mut settling = self.settling.write().unwrap_or_else(|e| e.into_inner());
            if settling.as_ref() != Some(&fingerprint) {
                // Changed since the last poll: wait until the files stop changing.
                *settling = Some(fingerprint);
                return None;
            }
            *settling = None;
        }
        let number = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let built = build_generation(&self.dir, number, self.evaluator);
        if fingerprint_of(&self.dir).as_ref() != Some(&fingerprint) {
            // Written to while being read: what was read may be a mix. Settle again.
            return None;
        }
        match built {
            Ok(generation) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(generation);
                *self.last_error.write().unwrap_or_else(|e| e.into_inner()) = None;
                *self.loaded_at.write().unwrap_or_else(|e| e.into_inner()) = SystemTime::now();
                metrics::counter!("sandgate_policy_reloads_total", "outcome" => "loaded")
                    .increment(1);
                tracing::info!(generation = number, "policy reloaded");
                Some(number)
            }
            Err(e) => {
                *self.rejected.write().unwrap_or_else(|e| e.into_inner()) = Some(fingerprint);
                self.record_failure(e);
                None
            }
        }
    }

    fn record_failure(&self, e: PolicyError) {
        let text = e.to_string();
        let mut last = self.last_error.write().unwrap_or_else(|e| e.into_inner());
        // The same failure seen again keeps its first time: that is when it started.
        if last.as_ref().map(|(t, _)| t.as_str()) != Some(text.as_str()) {
            metrics::counter!("sandgate_policy_reloads_total", "outcome" => "rejected")
                .increment(1);
            tracing::error!(error = %text, "policy reload rejected; the last good policy keeps serving");
            *last = Some((text, SystemTime::now()));
        }
    }

    /// Polls the directory every `interval` until the returned task is dropped/aborted.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let engine = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                let scope = crate::telemetry::MetricsScope::current();
                let _ = tokio::task::spawn_blocking(move || {
                    crate::telemetry::MetricsScope::run_in(scope, || engine.reload_if_changed())
                })
                .await;
            }
        })
    }

    /// The scopes that apply to `input` for `layer`, in evaluation order (for `policy eval`).
    pub fn scopes_for(&self, layer: &str, input: &Value) -> Vec<String> {
        let generation = self.current();
        let mut out = vec![PLATFORM_SCOPE.to_string()];
        if let Some(scope) = scope_for(&generation, layer, input) {
            out.push(scope.name.to_string());
        }
        out
    }

    /// [`PolicyEngine::evaluate`] with the layer named by its type.
    pub fn decide(&self, layer: Layer, input: Value) -> Decision {
        self.evaluate(layer.as_str(), input)
    }

    /// Evaluates one layer for `input`: the platform scope's rules, and those of the input's
    /// workspace scope when it has some for this layer. Allowed only when every applicable
    /// scope allows and none denies (see [`scope`]).
    fn evaluate(&self, layer: &'static str, input: Value) -> Decision {
        let started = Instant::now();
        // Only a logged decision keeps its input (a cheap reference-counted clone).
        let log = self.log_for(layer);
        let caller_log = self.caller_log_for(layer);
        let logged_input = (log.is_some() || caller_log.is_some()).then(|| input.clone());
        let generation = self.current();
        let (mut decision, outcome) = if !generation.present_layers.contains(&layer) {
            (
                refusal(
                    format!("no policy is loaded for layer {layer} (default deny)"),
                    &generation.platform_scope,
                ),
                "deny",
            )
        } else {
            let scope = scope_for(&generation, layer, &input);
            let scope_input = scope.map(|_| input.clone());
            let platform = match generation.programs.get(layer) {
                Some(program) => self.run_program(&generation, layer, 0, program, input),
                None => Self::run_interpreter(
                    self.instance,
                    &generation,
                    &format!("data.sandgate_internal.{layer}.decision"),
                    input,
                ),
            };
            let scoped = match (scope, scope_input) {
                (Some(scope), Some(input)) => {
                    Some((scope, self.run_scope(&generation, layer, scope, input)))
                }
                _ => None,
            };
            match (platform, scoped) {
                (Err(e), _) => (
                    self.eval_error(layer, &generation.platform_scope, e),
                    "error",
                ),
                (Ok(_), Some((scope, Err(e)))) => (self.eval_error(layer, &scope.name, e), "error"),
                (Ok(platform), scoped) => {
                    let scoped = scoped.and_then(|(scope, v)| v.ok().map(|v| (&scope.name, v)));
                    let mut decision = compose(&generation.platform_scope, platform, scoped);
                    let audited = generation.audited.contains(&layer);
                    audit::settle(layer, &mut decision, audited);
                    let outcome = if decision.allowed { "allow" } else { "deny" };
                    (decision, outcome)
                }
            }
        };
        let eval_time = started.elapsed();
        decision.generation = generation.number;
        decision.eval_time = eval_time;
        use crate::telemetry::hot;
        hot::histogram1("sandgate_policy_eval_seconds", ("layer", layer))
            .record(eval_time.as_secs_f64());
        hot::counter(
            "sandgate_policy_decisions_total",
            [("layer", layer), ("outcome", outcome)],
        )
        .increment(1);
        match (log, caller_log, logged_input) {
            (Some(log), _, Some(input)) => {
                decision.decision_id = Some(write_record(log, layer, outcome, &decision, &input));
            }
            (None, Some(log), Some(input)) => {
                self.keep_for_caller(log, layer, &mut decision, &input)
            }
            _ => {}
        }
        decision
    }

    fn eval_error(&self, layer: &'static str, scope: &Arc<str>, e: anyhow::Error) -> Decision {
        tracing::warn!(layer, scope = %scope, error = %e, "policy evaluation failed; denying");
        metrics::counter!("sandgate_policy_eval_errors_total", "layer" => layer).increment(1);
        let reason = if &**scope == PLATFORM_SCOPE {
            format!("policy evaluation error in layer {layer}")
        } else {
            format!("policy evaluation error in layer {layer} (scope {scope})")
        };
        refusal(reason, scope)
    }

    fn run_scope(
        &self,
        generation: &Generation,
        layer: &'static str,
        scope: &ScopeLayer,
        input: Value,
    ) -> anyhow::Result<Verdict> {
        let mut verdict = match &scope.program {
            Some(program) => self.run_program(generation, layer, scope.index, program, input)?,
            None => Self::run_interpreter(
                self.instance,
                generation,
                &format!("data.sandgate_internal.s{}.{layer}.decision", scope.index),
                input,
            )?,
        };
        if !scope.has_allow {
            verdict.allow = true;
        }
        Ok(verdict)
    }

    /// The fast path: bytecode on this worker's VM for (layer, scope).
    fn run_program(
        &self,
        generation: &Generation,
        layer: &'static str,
        scope: u32,
        program: &LayerProgram,
        input: Value,
    ) -> anyhow::Result<Verdict> {
        WORKER_VMS.with(|cell| {
            let mut vms = cell.borrow_mut();
            let key = (self.instance, layer, scope);
            let stale = vms
                .get(&key)
                .is_none_or(|(number, _)| *number != generation.number);
            if stale {
                let mut vm = regorus::rvm::RegoVM::new();
                vm.load_program(program.program.clone());
                vm.set_data(generation.data.clone())?;
                vms.insert(key, (generation.number, vm));
            }
            let vm = &mut vms.get_mut(&key).expect("inserted above").1;
            vm.set_input(input);
            let allow = match &program.allow {
                Some(rule) => vm.execute_entry_point_by_name(rule)?,
                None => Value::Bool(true),
            };
            let deny = match &program.deny {
                Some(rule) => vm.execute_entry_point_by_name(rule)?,
                None => Value::Undefined,
            };
            let action = match &program.action {
                Some(rule) => vm.execute_entry_point_by_name(rule)?,
                None => Value::Undefined,
            };
            let deny_mode = match &program.deny_mode {
                Some(rule) => vm.execute_entry_point_by_name(rule)?,
                None => Value::Undefined,
            };
            let audit = match &program.audit {
                Some(rule) => vm.execute_entry_point_by_name(rule)?,
                None => Value::Undefined,
            };
            Ok(verdict(&allow, &deny, &action, &audit).with_deny_mode(&deny_mode))
        })
    }

    /// The general path: the interpreter evaluating a wrapper's `decision` rule.
    fn run_interpreter(
        instance: u64,
        generation: &Generation,
        rule: &str,
        input: Value,
    ) -> anyhow::Result<Verdict> {
        let value = WORKER_ENGINES.with(|cell| {
            let mut engines = cell.borrow_mut();
            let slot = engines
                .entry(instance)
                .or_insert_with(|| (generation.number, generation.engine.clone()));
            if slot.0 != generation.number {
                *slot = (generation.number, generation.engine.clone());
            }
            let engine = &mut slot.1;
            engine.set_input(input);
            engine.eval_rule(rule.to_string())
        })?;
        let field = |name: &str| value[name].clone();
        Ok(verdict(
            &field("allow"),
            &field("deny"),
            &field("action"),
            &field(audit::AUDIT_RULE),
        )
        .with_deny_mode(&field("deny_mode")))
    }
}

/// The workspace scope with rules for `layer` that applies to `input`, if any. The input's
/// workspace is `input.workspace` (creation, provider, lifecycle, action) or
/// `input.sandbox.workspace` (egress, credential).
fn scope_for<'g>(generation: &'g Generation, layer: &str, input: &Value) -> Option<&'g ScopeLayer> {
    if generation.scoped.is_empty() {
        return None;
    }
    let ws = match &input["workspace"] {
        Value::String(ws) => ws.clone(),
        _ => match &input["sandbox"]["workspace"] {
            Value::String(ws) => ws.clone(),
            _ => return None,
        },
    };
    generation.scoped.get(&*ws)?.get(layer).map(|s| &**s)
}

fn refusal(reason: String, scope: &Arc<str>) -> Decision {
    Decision {
        allowed: false,
        reasons: vec![reason],
        action: "inspect".into(),
        deny_mode: None,
        generation: 0,
        eval_time: Duration::ZERO,
        decision_id: None,
        deny_scope: Some(scope.clone()),
        default_deny: false,
        logged: None,
        would_deny: Vec::new(),
    }
}

/// Composes the platform's verdict with a workspace scope's: every scope must allow, any
/// deny refuses, the reasons of both are given, and the scope that decided is named (an
/// explicit deny before a missing allow, the platform before the workspace). A workspace
/// can turn an egress `tunnel` into `inspect`, never the other way.
fn compose(
    platform_name: &Arc<str>,
    platform: Verdict,
    scoped: Option<(&Arc<str>, Verdict)>,
) -> Decision {
    let mut action = platform.action.unwrap_or_else(|| "inspect".into());
    let mut deny_mode = platform.deny_mode;
    let mut allowed = platform.allow && platform.deny.is_empty();
    let mut deny_scope = None;
    if !platform.deny.is_empty() {
        deny_scope = Some(platform_name.clone());
    }
    let mut reasons = platform.deny;
    let mut would_deny = platform.audit;
    let mut missing_allow = (!platform.allow).then(|| platform_name.clone());
    if let Some((name, scope)) = scoped {
        if scope.action.as_deref() == Some("inspect") {
            action = "inspect".into();
        }
        deny_mode = scope.deny_mode.or(deny_mode);
        allowed = allowed && scope.allow && scope.deny.is_empty();
        if deny_scope.is_none() && !scope.deny.is_empty() {
            deny_scope = Some(name.clone());
        }
        if missing_allow.is_none() && !scope.allow {
            missing_allow = Some(name.clone());
        }
        reasons.extend(scope.deny);
        would_deny.extend(scope.audit);
    }
    let default_deny = !allowed && reasons.is_empty();
    if !allowed {
        if reasons.is_empty() {
            match &missing_allow {
                Some(name) if **name != *PLATFORM_SCOPE => reasons.push(format!(
                    "no rule in scope {name} allowed this (default deny)"
                )),
                _ => reasons.push("no rule allowed this (default deny)".into()),
            }
        }
        deny_scope = deny_scope.or(missing_allow);
    }
    Decision {
        allowed,
        reasons: if allowed { Vec::new() } else { reasons },
        action,
        deny_mode,
        generation: 0,
        eval_time: Duration::ZERO,
        decision_id: None,
        deny_scope: if allowed { None } else { deny_scope },
        default_deny,
        logged: None,
        // The audit reasons, for [`audit::settle`] to keep or drop.
        would_deny,
    }
}

/// What a decision's record says about it: a new id, the input (made loggable later, on the
/// log's writer thread), and `{allow, deny, action (egress), scope (when refused)}`.
fn logged_eval(
    log: &DecisionLog,
    layer: &'static str,
    decision: &Decision,
    input: &Value,
) -> LoggedEval {
    let input = log.loggable(input);
    let deny: &[String] = if decision.allowed {
        &[]
    } else {
        &decision.reasons
    };
    let mut result = serde_json::json!({"allow": decision.allowed, "deny": deny});
    if layer == "egress" {
        result["action"] = decision.action.clone().into();
    }
    if let Some(scope) = &decision.deny_scope {
        result["scope"] = (**scope).into();
    }
    if !decision.would_deny.is_empty() {
        result["would_deny"] = decision.would_deny.clone().into();
    }
    LoggedEval {
        decision_id: crate::decision_log::new_decision_id(),
        input,
        result,
    }
}

/// Writes one OPA-shaped record for a decision; returns its id.
fn write_record(
    log: &DecisionLog,
    layer: &'static str,
    outcome: &'static str,
    decision: &Decision,
    input: &Value,
) -> String {
    let LoggedEval {
        decision_id,
        input,
        result,
    } = logged_eval(log, layer, decision, input);
    log.record_policy(PolicyRecord {
        kind: "policy",
        decision_id: decision_id.clone(),
        path: format!("sandgate/{layer}"),
        layer,
        decision: outcome,
        input,
        result,
        timestamp: crate::decision_log::now_rfc3339(),
        labels: Labels::new(decision.generation),
        metrics: PolicyMetrics {
            timer_rego_eval_ns: decision.eval_time.as_nanos() as u64,
        },
    });
    decision_id
}

fn verdict(allow: &Value, deny: &Value, action: &Value, audit: &Value) -> Verdict {
    let allow = allow.as_bool().ok().copied().unwrap_or(false);
    let action = match action {
        Value::String(s) if !s.is_empty() => Some(s.to_string()),
        _ => None,
    };
    Verdict {
        allow,
        deny: reason_list(deny),
        action,
        deny_mode: None,
        audit: reason_list(audit),
    }
}

impl Verdict {
    /// The verdict with the `deny_mode` rule's value (a non-empty string), if any.
    fn with_deny_mode(mut self, deny_mode: &Value) -> Verdict {
        if let Value::String(s) = deny_mode {
            if !s.is_empty() {
                self.deny_mode = Some(s.to_string());
            }
        }
        self
    }
}

/// The strings of a `deny`-like rule's set (or array); nothing when undefined.
fn reason_list(value: &Value) -> Vec<String> {
    // Matched rather than asked (`as_set`, `as_array`): each refused ask builds an error,
    // and an empty `deny` (what every allowed request has) was refused twice.
    match value {
        Value::Set(set) => set.iter().map(value_text).collect(),
        Value::Array(array) => array.iter().map(value_text).collect(),
        _ => Vec::new(),
    }
}

fn value_text(v: &Value) -> String {
    match v.as_string() {
        Ok(s) => s.to_string(),
        Err(_) => v.to_json_str().unwrap_or_default(),
    }
}

/// The wrapper that turns a layer package into one decision object, so a request costs one
/// rule evaluation. A layer's policy need not define `deny` or `action`.
fn decision_module(layer: &str) -> String {
    format!(
        r#"package sandgate_internal.{layer}
import rego.v1

allow := x if {{ x := data.sandgate.{layer}.allow }} else := false
deny := x if {{ x := data.sandgate.{layer}.deny }} else := set()
action := x if {{ x := data.sandgate.{layer}.action }} else := "inspect"
deny_mode := x if {{ x := data.sandgate.{layer}.deny_mode }} else := ""
audit_deny := x if {{ x := data.sandgate.{layer}.audit_deny }} else := set()
decision := {{"allow": allow, "deny": deny, "action": action, "deny_mode": deny_mode, "audit_deny": audit_deny}}
"#
    )
}

/// The wrapper for a workspace scope's layer. Its `action` is empty when the scope does not
/// set one (a scope only ever narrows, so "no opinion" must differ from `inspect`).
fn scope_module(index: u32, ws: &str, layer: &str, has_allow: bool) -> String {
    let rules = scope::workspace_ref(ws, layer);
    let allow = if has_allow {
        format!("allow := x if {{ x := {rules}.allow }} else := false")
    } else {
        "allow := true".to_string()
    };
    format!(
        r#"package sandgate_internal.s{index}.{layer}
import rego.v1

{allow}
deny := x if {{ x := {rules}.deny }} else := set()
action := x if {{ x := {rules}.action }} else := ""
deny_mode := x if {{ x := {rules}.deny_mode }} else := ""
audit_deny := x if {{ x := {rules}.audit_deny }} else := set()
decision := {{"allow": allow, "deny": deny, "action": action, "deny_mode": deny_mode, "audit_deny": audit_deny}}
"#
    )
}

struct PolicyFiles {
    rego: Vec<(String, PathBuf)>,
    tests: Vec<(String, PathBuf)>,
    data: Vec<(Vec<String>, String, PathBuf)>,
}

fn walk(dir: &Path) -> Result<PolicyFiles, PolicyError> {
    let mut files = PolicyFiles {
        rego: Vec::new(),
        tests: Vec::new(),
        data: Vec::new(),
    };
    let dir_err = |reason: String| PolicyError::Dir {
        dir: dir.to_path_buf(),
        reason,
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let entries = std::fs::read_dir(&current)
            .map_err(|e| dir_err(format!("{}: {e}", current.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| dir_err(e.to_string()))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                stack.push(path);
            } else if name.ends_with("_test.rego") {
                files.tests.push((rel, path));
            } else if name.ends_with(".rego") {
                files.rego.push((rel, path));
            } else if name == "data.json" {
                let mount: Vec<String> = Path::new(&rel)
                    .parent()
                    .map(|p| {
                        p.components()
                            .map(|c| c.as_os_str().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                files.data.push((mount, rel, path));
            }
        }
    }
    files.rego.sort();
    files.tests.sort();
    files.data.sort();
    Ok(files)
}

fn fingerprint_of(dir: &Path) -> Option<Vec<(String, u64, SystemTime)>> {
    fingerprint(dir).ok()
}

fn fingerprint(dir: &Path) -> Result<Vec<(String, u64, SystemTime)>, PolicyError> {
    let files = walk(dir)?;
    let mut out = Vec::new();
    for (rel, path) in files
        .rego
        .iter()
        .map(|(r, p)| (r, p))
        .chain(files.data.iter().map(|(_, r, p)| (r, p)))
    {
        let meta = std::fs::metadata(path).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
        out.push((
            rel.clone(),
            meta.len(),
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        ));
    }
    out.sort();
    Ok(out)
}

fn build_generation(
    dir: &Path,
    number: u64,
    evaluator: Evaluator,
) -> Result<Generation, PolicyError> {
    // Fingerprint first: a file edited while we read it is then seen as changed next time.
    let fingerprint = fingerprint(dir)?;
    let loaded = build_engine(dir, false)?;
    finish_generation(loaded, fingerprint, number, evaluator)
}

/// A directory loaded into an engine.
pub(crate) struct Loaded {
    pub engine: regorus::Engine,
    /// Every file loaded (`.rego` then `data.json`), relative to the directory.
    pub names: Vec<String>,
    /// `(file, package)` of every `.rego` file.
    pub modules: Vec<(String, String)>,
    /// SHA-256 (hex) over every loaded file's name and text, in load order: the same
    /// policy on two replicas has the same digest whatever their generation counters say.
    pub digest: String,
}

/// Loads the directory's policies and data (and, for `policy test`, the `*_test.rego`
/// files) into a fresh engine. A file whose package does not match its scope folder is
/// refused with its `file:line` ([`scope::check_package`]).
pub(crate) fn build_engine(dir: &Path, include_tests: bool) -> Result<Loaded, PolicyError> {
    let mut files = walk(dir)?;
    if include_tests {
        let tests = std::mem::take(&mut files.tests);
        files.rego.extend(tests);
    }
    let mut engine = regorus::Engine::new();
    engine.set_rego_v0(false);
    // OPA semantics: a built-in called with the wrong types is undefined, not an error.
    engine.set_strict_builtin_errors(false);
    let mut names = Vec::new();
    let mut modules = Vec::new();
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut hash = |rel: &str, text: &str| {
        // Lengths first, so that no two different file sets hash the same bytes.
        for part in [rel.as_bytes(), text.as_bytes()] {
            digest.update(&(part.len() as u64).to_be_bytes());
            digest.update(part);
        }
    };
    for (rel, path) in &files.rego {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
        hash(rel, &text);
        let package =
            engine
                .add_policy(rel.clone(), text.clone())
                .map_err(|e| PolicyError::File {
                    file: rel.clone(),
                    reason: e.to_string(),
                })?;
        scope::check_package(rel, &text, &package)?;
        names.push(rel.clone());
        modules.push((rel.clone(), package));
    }
    for (mount, rel, path) in &files.data {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
        hash(rel, &text);
        let mut value = Value::from_json_str(&text).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
        for key in mount.iter().rev() {
            let mut wrapper = std::collections::BTreeMap::new();
            wrapper.insert(Value::from(key.as_str()), value);
            value = Value::from(wrapper);
        }
        engine.add_data(value).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
        names.push(rel.clone());
    }
    Ok(Loaded {
        engine,
        names,
        modules,
        digest: hex::encode(digest.finish()),
    })
}

fn finish_generation(
    loaded: Loaded,
    fingerprint: Vec<(String, u64, SystemTime)>,
    number: u64,
    evaluator: Evaluator,
) -> Result<Generation, PolicyError> {
    let Loaded {
        mut engine,
        names,
        modules,
        digest,
    } = loaded;
    let packages = engine
        .get_packages()
        .map_err(|e| PolicyError::Compile(e.to_string()))?;
    let mut present_layers = Vec::new();
    for layer in LAYERS {
        if packages
            .iter()
            .any(|p| p == &format!("data.sandgate.{layer}"))
        {
            engine
                .add_policy(format!("<sandgate:{layer}>"), decision_module(layer))
                .map_err(|e| PolicyError::Compile(e.to_string()))?;
            present_layers.push(*layer);
        }
    }
    // Workspace scopes, in a stable order (their index names wrappers and VMs).
    let mut scope_layers: Vec<(String, &'static str)> = packages
        .iter()
        .filter_map(|p| scope::scope_layer(p))
        .collect();
    scope_layers.sort();
    scope_layers.dedup();
    let mut scope_specs = Vec::new();
    for (index, (ws, layer)) in scope_layers.into_iter().enumerate() {
        let index = index as u32 + 1;
        let package = format!("{}{ws}.{layer}", scope::WORKSPACE_PREFIX);
        let mut has_allow = false;
        for (file, _) in modules.iter().filter(|(_, p)| *p == package) {
            has_allow |= engine
                .has_declared_rule_rooted_at(file, "allow")
                .map_err(|e| PolicyError::Compile(format!("{file}: {e}")))?;
        }
        engine
            .add_policy(
                format!("<sandgate:{ws}:{layer}>"),
                scope_module(index, &ws, layer, has_allow),
            )
            .map_err(|e| PolicyError::Compile(e.to_string()))?;
        scope_specs.push((index, ws, layer, has_allow));
    }
    // Evaluate each layer and scope once so errors that only surface at evaluation time
    // (unsafe variables, conflicting rules, unknown functions) reject the generation now.
    let wrappers = present_layers
        .iter()
        .map(|layer| format!("data.sandgate_internal.{layer}.decision"))
        .chain(scope_specs.iter().map(|(index, _, layer, _)| {
            format!("data.sandgate_internal.s{index}.{layer}.decision")
        }));
    for rule in wrappers {
        engine.set_input(Value::new_object());
        engine
            .eval_rule(rule)
            .map_err(|e| PolicyError::Compile(e.to_string()))?;
    }
    let audited = audit::audited_layers(&mut engine)?;
    let data = engine.get_data();
    let mut programs = HashMap::new();
    for layer in present_layers
        .iter()
        .filter(|_| evaluator == Evaluator::Bytecode)
    {
        match compile_rules(&mut engine, &format!("data.sandgate.{layer}"), true) {
            Ok(program) => {
                programs.insert(*layer, Arc::new(program));
            }
            Err(e) => tracing::info!(
                layer,
                error = %e,
                "layer evaluated by the interpreter (the bytecode compiler does not support it)"
            ),
        }
    }
    // The bytecode must decide as the interpreter does; a layer that does not on a probe
    // input is left to the interpreter (see `probe`).
    let mut fallbacks = Vec::new();
    programs.retain(|layer, program| {
        let wrapper = format!("data.sandgate_internal.{layer}.decision");
        match disagreement(&mut engine, &data, layer, &wrapper, program) {
            None => true,
            Some(why) => {
                fallbacks.push(Fallback::new(PLATFORM_SCOPE, layer, why));
                false
            }
        }
    });
    let mut scoped: HashMap<String, HashMap<&'static str, Arc<ScopeLayer>>> = HashMap::new();
    for (index, ws, layer, has_allow) in scope_specs {
        let program = match evaluator {
            Evaluator::Interpreter => None,
            Evaluator::Bytecode => {
                match compile_rules(&mut engine, &scope::workspace_ref(&ws, layer), false) {
                    Ok(program) => Some(Arc::new(program)),
                    Err(e) => {
                        tracing::info!(
                            layer,
                            workspace = %ws,
                            error = %e,
                            "workspace scope evaluated by the interpreter (the bytecode compiler does not support it)"
                        );
                        None
                    }
                }
            }
        };
        let wrapper = format!("data.sandgate_internal.s{index}.{layer}.decision");
        let program = program.filter(|program| {
            match disagreement(&mut engine, &data, layer, &wrapper, program) {
                None => true,
                Some(why) => {
                    fallbacks.push(Fallback::new(&scope::workspace_scope_name(&ws), layer, why));
                    false
                }
            }
        });
        scoped.entry(ws.clone()).or_default().insert(
            layer,
            Arc::new(ScopeLayer {
                name: scope::workspace_scope_name(&ws).into(),
                index,
                has_allow,
                program,
            }),
        );
    }
    Ok(Generation {
        number,
        digest,
        files: names,
        fingerprint,
        engine,
        present_layers,
        programs,
        data,
        scoped,
        platform_scope: PLATFORM_SCOPE.into(),
        fallbacks,
        audited,
    })
}

/// Runs the probe inputs for `layer` through `program` and through the interpreter's
/// `wrapper`; describes the first disagreement.
fn disagreement(
    engine: &mut regorus::Engine,
    data: &Value,
    layer: &'static str,
    wrapper: &str,
    program: &LayerProgram,
) -> Option<String> {
    let mut vm = regorus::rvm::RegoVM::new();
    vm.load_program(program.program.clone());
    if let Err(e) = vm.set_data(data.clone()) {
        return Some(format!("the bytecode VM does not take the data: {e}"));
    }
    let inspect = |v: Verdict| Verdict {
        action: v.action.or_else(|| Some("inspect".into())),
        ..v
    };
    for input in probe::inputs(layer, data) {
        vm.set_input(input.clone());
        let mut run = || -> anyhow::Result<Verdict> {
            let rule = |name: &Option<String>, vm: &mut regorus::rvm::RegoVM| match name {
                Some(n) => vm.execute_entry_point_by_name(n),
                None => Ok(Value::Undefined),
            };
            let allow = match &program.allow {
                Some(n) => vm.execute_entry_point_by_name(n)?,
                None => Value::Bool(true),
            };
            let deny = rule(&program.deny, &mut vm)?;
            let action = rule(&program.action, &mut vm)?;
            let deny_mode = rule(&program.deny_mode, &mut vm)?;
            let audit = rule(&program.audit, &mut vm)?;
            Ok(verdict(&allow, &deny, &action, &audit).with_deny_mode(&deny_mode))
        };
        let fast = run();
        engine.set_input(input.clone());
        let slow = engine.eval_rule(wrapper.to_string()).map(|value| {
            let field = |name: &str| value[name].clone();
            let mut v = verdict(
                &field("allow"),
                &field("deny"),
                &field("action"),
                &field(audit::AUDIT_RULE),
            )
            .with_deny_mode(&field("deny_mode"));
            if program.allow.is_none() {
                // A scope without `allow` allows; its wrapper says so too.
                v.allow = true;
            }
            v
        });
        let same = match (&fast, &slow) {
            (Ok(a), Ok(b)) => inspect(a.clone()) == inspect(b.clone()),
            (Err(_), Err(_)) => true,
            _ => false,
        };
        if !same {
            let show = |r: &anyhow::Result<Verdict>| match r {
                Ok(v) => format!("allow={} deny={:?}", v.allow, v.deny),
                Err(e) => format!("error: {e}"),
            };
            let why = format!(
                "bytecode ({}) and interpreter ({}) disagree on input {}",
                show(&fast),
                show(&slow),
                input.to_json_str().unwrap_or_default().replace('\n', "")
            );
            tracing::warn!(layer, %why, "policy layer falls back to the interpreter");
            return Some(why);
        }
    }
    None
}

/// Compiles the `allow`, `deny` and `action` rules (those defined) of the package at
/// `package` (a Rego reference, `data.sandgate.egress`) to bytecode. `allow` is required for
/// the platform's layers (without it the wrapper's default deny applies, via the
/// interpreter); a workspace scope may leave it out.
fn compile_rules(
    engine: &mut regorus::Engine,
    package: &str,
    require_allow: bool,
) -> anyhow::Result<LayerProgram> {
    let names = ["allow", "deny", "action", "deny_mode", audit::AUDIT_RULE]
        .map(|rule| format!("{package}.{rule}"));
    // Any defined rule serves as the entry point that compiles the package.
    let mut compiled = None;
    for entry in &names {
        if let Ok(c) = engine.compile_with_entrypoint(&entry.as_str().into()) {
            compiled = Some(c);
            break;
        }
    }
    let Some(compiled) = compiled else {
        anyhow::bail!("{package} defines none of allow, deny, action");
    };
    let defined = |path: &String| {
        compiled
            .get_rules()
            .contains_key(path)
            .then(|| path.clone())
    };
    let [allow, deny, action, deny_mode, audit] = names.each_ref().map(defined);
    if require_allow && allow.is_none() {
        anyhow::bail!("{package} defines no allow rule");
    }
    let entry_points: Vec<&str> = [&allow, &deny, &action, &deny_mode, &audit]
        .into_iter()
        .flatten()
        .map(|s| s.as_str())
        .collect();
    let program = regorus::languages::rego::compiler::Compiler::compile_from_policy(
        &compiled,
        &entry_points,
    )?;
    Ok(LayerProgram {
        program,
        allow,
        deny,
        action,
        deny_mode,
        audit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundled() -> PolicyEngine {
        PolicyEngine::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap()
    }

    #[test]
    fn bundled_credential_layer_allows_a_matching_destination() {
        let engine = bundled();
        let input = Value::from(serde_json::json!({
            "credential": {"name": "x", "workspace": "ws", "user": null,
                "destinations": [{"host": "api.a.test", "ports": [8443], "methods": [], "path_prefix": null}]},
            "sandbox": {"id": "sb", "workspace": "ws", "labels": {}, "allow_domains": []},
            "destination": {"host": "api.a.test", "port": 8443, "ip": null, "scheme": "https", "match_names": ["api.a.test"]},
            "request": {"method": "GET", "path": "/"}
        }));
        let mut engine_for_errors = engine.current().engine.clone();
        engine_for_errors.set_input(input.clone());
        let raw = engine_for_errors.eval_rule("data.sandgate_internal.credential.decision".into());
        assert!(raw.is_ok(), "{raw:?}");
        let decision = engine.decide(Layer::Credential, input);
        assert!(decision.allowed, "{:?}", decision.reasons);
    }
}

#[cfg(test)]
mod bytecode_tests {
    use super::*;

    fn input(host: &str, method: &str) -> Value {
        let names = crate::domain::match_names(host);
        Value::from(serde_json::json!({
            "phase": "request",
            "sandbox": {"id": "sb", "workspace": "ws", "labels": {}, "allow_domains": ["api.a.test", "*.wild.test"]},
            "destination": {"host": host, "port": 443, "ip": null, "scheme": "https", "match_names": names},
            "request": {"method": method, "path": "/", "headers": {}},
            "credential": {"name": "x", "workspace": "ws", "user": null,
                "destinations": [{"host": "api.a.test", "ports": [], "methods": ["GET"], "path_prefix": null}]},
        }))
    }

    #[test]
    fn the_interpreter_evaluator_compiles_no_bytecode_and_decides_the_same() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let reference = PolicyEngine::load_with(&dir, Evaluator::Interpreter).unwrap();
        let fast = PolicyEngine::load_with(&dir, Evaluator::Bytecode).unwrap();
        assert!(reference.current().programs.is_empty());
        assert!(!fast.current().programs.is_empty());
        for host in ["api.a.test", "evil.test"] {
            let a = reference.decide(Layer::Egress, input(host, "GET"));
            let b = fast.decide(Layer::Egress, input(host, "GET"));
            assert_eq!((a.allowed, a.reasons), (b.allowed, b.reasons), "{host}");
        }
    }

    /// The bytecode path must decide exactly as the interpreter does.
    #[test]
    fn bytecode_and_interpreter_agree_on_the_bundled_layers() {
        let engine =
            PolicyEngine::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
        let generation = engine.current();
        for layer in ["egress", "credential"] {
            let program = generation
                .programs
                .get(layer)
                .unwrap_or_else(|| panic!("layer {layer} was not compiled to bytecode"));
            for (host, method) in [
                ("api.a.test", "GET"),
                ("x.wild.test", "POST"),
                ("evil.test", "GET"),
                ("wild.test", "GET"),
            ] {
                let fast = engine
                    .run_program(&generation, layer, 0, program, input(host, method))
                    .unwrap();
                let slow = PolicyEngine::run_interpreter(
                    engine.instance,
                    &generation,
                    &format!("data.sandgate_internal.{layer}.decision"),
                    input(host, method),
                )
                .unwrap();
                let inspect = |v: &Verdict| v.action.clone().unwrap_or_else(|| "inspect".into());
                assert_eq!(
                    (fast.allow, &fast.deny, inspect(&fast)),
                    (slow.allow, &slow.deny, inspect(&slow)),
                    "{layer} {host} {method}"
                );
            }
        }
    }
}

#[cfg(test)]
mod layer_tests {
    use super::*;

    #[test]
    fn every_layer_is_named_as_the_engine_knows_it() {
        let names: Vec<&str> = Layer::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(names, LAYERS);
    }
}
