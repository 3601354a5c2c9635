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
//! - An evaluation error denies.
//! - The compiled generation is shared; each worker thread keeps its own clone of the
//!   engine (regorus evaluation takes `&mut self`), refreshed when the generation changes,
//!   so nothing is parsed on the request path.
//! - Every evaluation counts in `sandgate_policy_decisions_total{layer, outcome}` and
//!   `sandgate_policy_eval_seconds{layer}`, and, when a decision log is attached
//!   ([`PolicyEngine::set_decision_log`]), writes one OPA-shaped record. Nothing is built for
//!   the log when it is off: the egress path evaluates per request.

pub mod input;
pub mod testing;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use regorus::Value;

use crate::decision_log::{DecisionLog, Labels, PolicyMetrics, PolicyRecord};

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
    pub generation: u64,
    pub eval_time: Duration,
    /// The decision log record's id, when one was written (to correlate a refusal with it).
    pub decision_id: Option<String>,
}

struct Generation {
    number: u64,
    files: Vec<String>,
    fingerprint: Vec<(String, u64, SystemTime)>,
    engine: regorus::Engine,
    present_layers: Vec<&'static str>,
    /// Bytecode for each layer the RVM compiles: the fast path. A layer the RVM cannot
    /// compile is evaluated by the interpreter through its wrapper module instead.
    programs: HashMap<&'static str, Arc<LayerProgram>>,
    /// `data` for the VMs (the interpreter has it inside its engine).
    data: Value,
}

struct LayerProgram {
    program: Arc<regorus::rvm::program::Program>,
    allow: String,
    deny: Option<String>,
    action: Option<String>,
}

/// What `/healthz` and the API report about policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyStatus {
    pub generation: u64,
    pub files: Vec<String>,
    pub last_error: Option<String>,
    pub loaded_at_unix: u64,
}

/// `GET /v1/policies`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct PolicyReport {
    /// The generation serving decisions now.
    pub generation: u64,
    /// When that generation was loaded (RFC 3339).
    pub loaded_at: String,
    pub dir: String,
    #[schema(value_type = String, example = "bytecode")]
    pub evaluator: Evaluator,
    /// Files of the serving generation (`.rego` and `data.json`), relative to `dir`.
    pub files: Vec<String>,
    pub layers: LayerReport,
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

type VmKey = (u64, &'static str);

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
        let rfc3339 = |t: SystemTime| {
            time::OffsetDateTime::from(t)
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        };
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
        let number = self.next_generation.fetch_add(1, Ordering::Relaxed);
        match build_generation(&self.dir, number, self.evaluator) {
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
                let _ = tokio::task::spawn_blocking(move || engine.reload_if_changed()).await;
            }
        })
    }

    /// Evaluates one layer for `input`.
    pub fn evaluate(&self, layer: &'static str, input: Value) -> Decision {
        let started = Instant::now();
        // Only a logged decision keeps its input (a cheap reference-counted clone).
        let log = self.log_for(layer);
        let logged_input = log.map(|_| input.clone());
        let generation = self.current();
        let (mut decision, outcome) = if !generation.present_layers.contains(&layer) {
            (
                Decision {
                    allowed: false,
                    reasons: vec![format!(
                        "no policy is loaded for layer {layer} (default deny)"
                    )],
                    action: "inspect".into(),
                    generation: generation.number,
                    eval_time: Duration::ZERO,
                    decision_id: None,
                },
                "deny",
            )
        } else {
            let result = match generation.programs.get(layer) {
                Some(program) => self.run_program(&generation, layer, program, input),
                None => Self::run_interpreter(self.instance, &generation, layer, input),
            };
            match result {
                Ok(decision) => {
                    let outcome = if decision.allowed { "allow" } else { "deny" };
                    (decision, outcome)
                }
                Err(e) => {
                    tracing::warn!(layer, error = %e, "policy evaluation failed; denying");
                    metrics::counter!("sandgate_policy_eval_errors_total", "layer" => layer)
                        .increment(1);
                    (
                        Decision {
                            allowed: false,
                            reasons: vec![format!("policy evaluation error in layer {layer}")],
                            action: "inspect".into(),
                            generation: 0,
                            eval_time: Duration::ZERO,
                            decision_id: None,
                        },
                        "error",
                    )
                }
            }
        };
        let eval_time = started.elapsed();
        decision.generation = generation.number;
        decision.eval_time = eval_time;
        metrics::histogram!("sandgate_policy_eval_seconds", "layer" => layer)
            .record(eval_time.as_secs_f64());
        metrics::counter!("sandgate_policy_decisions_total", "layer" => layer, "outcome" => outcome)
            .increment(1);
        if let (Some(log), Some(input)) = (log, logged_input) {
            decision.decision_id = Some(write_record(log, layer, outcome, &decision, &input));
        }
        decision
    }

    /// The fast path: the layer's bytecode on this worker's VM.
    fn run_program(
        &self,
        generation: &Generation,
        layer: &'static str,
        program: &LayerProgram,
        input: Value,
    ) -> anyhow::Result<Decision> {
        WORKER_VMS.with(|cell| {
            let mut vms = cell.borrow_mut();
            let key = (self.instance, layer);
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
            let allow = vm.execute_entry_point_by_name(&program.allow)?;
            let deny = match &program.deny {
                Some(rule) => vm.execute_entry_point_by_name(rule)?,
                None => Value::Undefined,
            };
            let action = match &program.action {
                Some(rule) => vm.execute_entry_point_by_name(rule)?,
                None => Value::Undefined,
            };
            let mut fields = std::collections::BTreeMap::new();
            fields.insert(Value::from("allow"), allow);
            fields.insert(Value::from("deny"), deny);
            fields.insert(Value::from("action"), action);
            Ok(read_decision(&Value::from(fields)))
        })
    }

    /// The general path: the interpreter evaluating the layer's wrapper rule.
    fn run_interpreter(
        instance: u64,
        generation: &Generation,
        layer: &'static str,
        input: Value,
    ) -> anyhow::Result<Decision> {
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
            engine.eval_rule(format!("data.sandgate_internal.{layer}.decision"))
        })?;
        Ok(read_decision(&value))
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
    let mut input = serde_json::to_value(input).unwrap_or(serde_json::Value::Null);
    crate::decision_log::redact_input(&mut input);
    let deny: &[String] = if decision.allowed {
        &[]
    } else {
        &decision.reasons
    };
    let mut result = serde_json::json!({"allow": decision.allowed, "deny": deny});
    if layer == "egress" {
        result["action"] = decision.action.clone().into();
    }
    let decision_id = crate::decision_log::new_decision_id();
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

fn read_decision(value: &Value) -> Decision {
    let field = |name: &str| {
        value
            .as_object()
            .ok()
            .and_then(|o| o.get(&Value::from(name)).cloned())
    };
    let allow = field("allow")
        .and_then(|v| v.as_bool().ok().copied())
        .unwrap_or(false);
    let mut reasons: Vec<String> = Vec::new();
    if let Some(deny) = field("deny") {
        if let Ok(set) = deny.as_set() {
            for reason in set.iter() {
                reasons.push(value_text(reason));
            }
        } else if let Ok(array) = deny.as_array() {
            for reason in array.iter() {
                reasons.push(value_text(reason));
            }
        }
    }
    let action = field("action")
        .and_then(|v| v.as_string().ok().map(|s| s.to_string()))
        .unwrap_or_else(|| "inspect".into());
    let allowed = allow && reasons.is_empty();
    if !allowed && reasons.is_empty() {
        reasons.push("no rule allowed this (default deny)".into());
    }
    Decision {
        allowed,
        reasons,
        action,
        generation: 0,
        eval_time: Duration::ZERO,
        decision_id: None,
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
decision := {{"allow": allow, "deny": deny, "action": action}}
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
    let (engine, names) = build_engine(dir, false)?;
    finish_generation(engine, names, fingerprint, number, evaluator)
}

/// Loads the directory's policies and data (and, for `policy test`, the `*_test.rego`
/// files) into a fresh engine.
pub(crate) fn build_engine(
    dir: &Path,
    include_tests: bool,
) -> Result<(regorus::Engine, Vec<String>), PolicyError> {
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
    for (rel, path) in &files.rego {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
        engine
            .add_policy(rel.clone(), text)
            .map_err(|e| PolicyError::File {
                file: rel.clone(),
                reason: e.to_string(),
            })?;
        names.push(rel.clone());
    }
    for (mount, rel, path) in &files.data {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
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
    Ok((engine, names))
}

fn finish_generation(
    mut engine: regorus::Engine,
    names: Vec<String>,
    fingerprint: Vec<(String, u64, SystemTime)>,
    number: u64,
    evaluator: Evaluator,
) -> Result<Generation, PolicyError> {
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
    // Evaluate each layer once so errors that only surface at evaluation time (unsafe
    // variables, conflicting rules, unknown functions) reject the generation now.
    for layer in &present_layers {
        engine.set_input(Value::new_object());
        engine
            .eval_rule(format!("data.sandgate_internal.{layer}.decision"))
            .map_err(|e| PolicyError::Compile(e.to_string()))?;
    }
    let data = engine.get_data();
    let mut programs = HashMap::new();
    for layer in present_layers
        .iter()
        .filter(|_| evaluator == Evaluator::Bytecode)
    {
        match compile_layer(&mut engine, layer) {
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
    Ok(Generation {
        number,
        files: names,
        fingerprint,
        engine,
        present_layers,
        programs,
        data,
    })
}

/// Compiles a layer's `allow`, `deny` and `action` rules (those it defines) to bytecode.
fn compile_layer(engine: &mut regorus::Engine, layer: &str) -> anyhow::Result<LayerProgram> {
    let allow = format!("data.sandgate.{layer}.allow");
    let compiled = engine.compile_with_entrypoint(&allow.as_str().into())?;
    let defined = |rule: &str| {
        let path = format!("data.sandgate.{layer}.{rule}");
        compiled.get_rules().contains_key(&path).then_some(path)
    };
    if defined("allow").is_none() {
        anyhow::bail!("layer {layer} defines no allow rule");
    }
    let deny = defined("deny");
    let action = defined("action");
    let mut entry_points = vec![allow.as_str()];
    entry_points.extend(deny.as_deref());
    entry_points.extend(action.as_deref());
    let program = regorus::languages::rego::compiler::Compiler::compile_from_policy(
        &compiled,
        &entry_points,
    )?;
    Ok(LayerProgram {
        program,
        allow,
        deny,
        action,
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
        let decision = engine.evaluate("credential", input);
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
            let a = reference.evaluate("egress", input(host, "GET"));
            let b = fast.evaluate("egress", input(host, "GET"));
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
                    .run_program(&generation, layer, program, input(host, method))
                    .unwrap();
                let slow = PolicyEngine::run_interpreter(
                    engine.instance,
                    &generation,
                    layer,
                    input(host, method),
                )
                .unwrap();
                assert_eq!(
                    (fast.allowed, &fast.reasons, &fast.action),
                    (slow.allowed, &slow.reasons, &slow.action),
                    "{layer} {host} {method}"
                );
            }
        }
    }
}
