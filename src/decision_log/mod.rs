//! The decision log: one JSON line per decision, written off the request path by a
//! background thread so a slow disk never stalls a proxied request.
//!
//! Every line carries the OPA decision-log fields (`decision_id`, `path`, `input`, `result`,
//! `timestamp`, `labels`, `metrics`), so tools that read OPA's logs read ours. Two writers:
//! - the policy engine, for every layer it evaluates (`kind: "policy"`), with the input it was
//!   given minus anything secret ([`redact_input`]);
//! - the egress proxy, once per egress decision (`kind: "egress"`), with its flat fields
//!   (sandbox, host, method, path, code, credentials, latency) plus the OPA fields: when
//!   policy decided, the engine's id, complete (redacted) input and answer, handed over in
//!   [`LoggedEval`], so the record can be replayed (`crate::policy::replay`). The engine does not also log the `egress` layer: the proxy's record is the richer
//!   one (it covers refusals made before or after policy too), and one line per decision keeps
//!   the log countable.
//!
//! The same writer thread keeps each record, serialized once, in the in-memory ring
//! ([`crate::decision_ring`], `[log] decisions_ring`) that `GET /v1/decisions` reads, whether
//! or not there is a sink: with the sink `off` and the ring on, records are still built. When
//! the ring is the only reader (sink `off`, no export), the egress proxy renders its records
//! and files them in the ring itself, on its own thread: sending each to the writer cost more
//! than everything else the ring does (see [`DecisionLog`]'s `direct`).
//! With `[telemetry] otlp_logs = true` it also hands those bytes to
//! [`crate::telemetry::DecisionExport`], which sends them to the collector as OTLP log
//! records; [`DecisionLog::close`] has them exported before the process exits.
//!
//! Records carry no header values that authenticate and no query values (those are where
//! tokens travel), only their keys. An exec's argument vector is logged as its program, its
//! length and a hash ([`summarize_argv`]), since arguments carry secrets as often as headers
//! do (`curl -u user:pass`, `mysql -pPASS`); `[log] full_argv = true` logs it whole. The
//! policy always sees it whole.

use std::borrow::Cow;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::decision_ring::{DecisionRing, Meta};
use crate::telemetry::{DecisionEvent, DecisionExport, DECISIONS_QUEUE};

mod line;
mod render;

pub use render::SharedObject;

#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
    pub ts: String,
    pub kind: &'static str,
    pub sandbox: Option<String>,
    pub workspace: Option<String>,
    pub phase: &'static str,
    pub protocol: &'static str,
    pub host: String,
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Formatted on the writer thread, not the request path (serde writes it as text).
    pub ip: Option<std::net::IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub decision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    pub reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Names of the credentials applied to the request (never their values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// Their `type` (`header`, `aws_sigv4`, `oauth2`, ...), in the order of `credentials`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credential_types: Vec<&'static str>,
    pub policy_generation: u64,
    pub latency_us: u64,
    /// The policy's own decision behind this record, when policy decided (it did not for a
    /// refusal made before policy, e.g. a placeholder in the host): its id, its complete
    /// input and its answer, which is what `sandgate policy eval --replay` re-evaluates.
    #[serde(skip)]
    pub policy: Option<std::sync::Arc<LoggedEval>>,
    /// A refused CONNECT: how it was answered, `in_tunnel` (a 403 for each request inside
    /// the tunnel) or `connect` (the CONNECT's own 403).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deny_mode: Option<&'static str>,
    /// Credentials of the workspace whose destination host matched but which were not
    /// applied, each with why (port, method, path prefix, policy).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credential_notes: Vec<String>,
    /// Top-level objects of the policy input that the record's tunnel shares with its other
    /// requests (its sandbox part, its vetted destination): written from their renderings,
    /// made once per tunnel ([`SharedObject`]). Unset, or not in the input, they are
    /// rendered with the rest of it: the line is the same either way.
    #[serde(skip)]
    pub shared: [Option<Arc<SharedObject>>; 2],
}

/// A policy decision whose caller writes the log record itself (the egress proxy): what the
/// engine would have logged, handed to the caller through [`crate::policy::Decision`].
#[derive(Debug)]
pub struct LoggedEval {
    pub decision_id: String,
    /// The input exactly as evaluated; made loggable (secrets out) on the writer thread.
    pub input: LoggedInput,
    /// `{allow, deny, action, scope?}` as the policy answered, before anything the caller
    /// did after it (a dial failure, a guard refusal): replay compares against this.
    pub result: serde_json::Value,
}

/// A policy input as the engine evaluated it, kept as the engine's own reference-counted
/// value until the writer thread makes it loggable ([`LoggedInput::to_json`]). Converting
/// an input to JSON and redacting it costs more than the policy decision itself on a
/// keep-alive request, and nothing reads it before the writer does, so the request path
/// only bumps a reference count.
#[derive(Debug, Clone)]
pub struct LoggedInput {
    value: regorus::Value,
    /// `[log] full_argv`: keep an exec's argv whole instead of [`summarize_argv`]'s summary.
    full_argv: bool,
}

impl LoggedInput {
    /// The input as it may be logged: JSON, [`redact_input`], then [`summarize_argv`]
    /// unless `[log] full_argv` is set.
    pub fn to_json(&self) -> serde_json::Value {
        let mut input = serde_json::to_value(&self.value).unwrap_or(serde_json::Value::Null);
        redact_input(&mut input);
        if !self.full_argv {
            summarize_argv(&mut input);
        }
        input
    }

    /// Appends the loggable input (as [`LoggedInput::to_json`] makes it) to `out`, in one
    /// pass when [`render`] can, else through the JSON tree.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        self.write_json_with(out, &[]);
    }

    /// [`LoggedInput::write_json`], with the top-level objects `shared` holds written from
    /// their renderings ([`SharedObject`]).
    fn write_json_with(&self, out: &mut Vec<u8>, shared: &[Option<Arc<SharedObject>>]) {
        let start = out.len();
        if render::write_input(&self.value, self.full_argv, out, shared).is_err() {
            out.truncate(start);
            // Writing a Value into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, &self.to_json());
        }
    }

    /// A string field of the input at `path`, for what the ring files a record under.
    fn text(&self, path: &[&str]) -> Option<String> {
        let mut at = &self.value;
        for key in path {
            at = &at[*key];
        }
        match at {
            regorus::Value::String(s) => Some(s.to_string()),
            _ => None,
        }
    }
}

/// `line`, a serialized JSON object, with `"input":` and `input` appended as its last field.
#[cfg(test)]
fn with_input(mut line: Vec<u8>, input: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    append_input(&mut line, 0, input);
    line
}

/// The JSON object written at `out[start..]`, with `"input":` and `input` appended as its
/// last field.
fn append_input(out: &mut Vec<u8>, start: usize, input: impl FnOnce(&mut Vec<u8>)) {
    debug_assert_eq!(out.last(), Some(&b'}'));
    out.pop();
    if out.len() > start + 1 {
        out.push(b',');
    }
    out.extend_from_slice(b"\"input\":");
    input(out);
    out.push(b'}');
}

/// One policy decision in OPA's decision-log shape, written by the policy engine.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyRecord {
    /// Always `policy` (egress proxy records say `egress`).
    pub kind: &'static str,
    pub decision_id: String,
    /// The package path, `sandgate/<layer>` (as OPA writes `path`).
    pub path: String,
    pub layer: &'static str,
    /// `allow`, `deny` or `error` (an evaluation error denies).
    pub decision: &'static str,
    /// The input document as evaluated; written with secrets removed ([`LoggedInput`]).
    #[serde(skip)]
    pub input: LoggedInput,
    /// `{allow, deny: [...]}`, plus `action` for egress and `scope` (the scope that refused).
    pub result: serde_json::Value,
    pub timestamp: String,
    pub labels: Labels,
    pub metrics: PolicyMetrics,
}

#[derive(Debug, Clone, Serialize)]
pub struct Labels {
    pub app: &'static str,
    pub version: &'static str,
    /// The policy generation that decided.
    pub generation: u64,
}

impl Labels {
    pub fn new(generation: u64) -> Labels {
        Labels {
            app: "sandgate",
            version: env!("CARGO_PKG_VERSION"),
            generation,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicyMetrics {
    pub timer_rego_eval_ns: u64,
}

/// What goes through the writer's queue.
// Records travel unboxed: boxing one would cost an allocation per request, to shrink a
// variant sent once per process.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Entry {
    Record(Logged),
    /// [`DecisionLog::close`]: export what is queued, then answer.
    Close(tokio::sync::oneshot::Sender<()>),
}

/// A record to write.
#[derive(Debug)]
enum Logged {
    Egress(DecisionRecord),
    Policy(PolicyRecord),
}

/// What a record rendered into the writer's buffer is filed under: the ring's fields and
/// its decision id.
struct Rendered<'a> {
    sandbox: Option<Cow<'a, str>>,
    workspace: Option<Cow<'a, str>>,
    layer: &'static str,
    decision: &'static str,
    decision_id: Cow<'a, str>,
}

impl Rendered<'_> {
    fn meta(&self) -> Meta<'_> {
        Meta {
            sandbox: self.sandbox.as_deref(),
            workspace: self.workspace.as_deref(),
            layer: self.layer,
            decision: self.decision,
        }
    }
}

impl Logged {
    /// Appends the record's JSON line (without the newline) to `out`, which it leaves as
    /// it found it on an error; says what the ring files it under and its decision id.
    fn render(&self, out: &mut Vec<u8>) -> serde_json::Result<Rendered<'_>> {
        match self {
            Logged::Egress(r) => {
                let decision_id = egress_decision_id(r);
                line::egress_line(r, &decision_id, out);
                Ok(Rendered {
                    sandbox: r.sandbox.as_deref().map(Cow::Borrowed),
                    workspace: r.workspace.as_deref().map(Cow::Borrowed),
                    layer: "egress",
                    decision: r.decision,
                    decision_id,
                })
            }
            Logged::Policy(record) => {
                let input = &record.input;
                let start = out.len();
                if let Err(e) = serde_json::to_writer(&mut *out, record) {
                    out.truncate(start);
                    return Err(e);
                }
                append_input(out, start, |out| input.write_json(out));
                Ok(Rendered {
                    sandbox: input.text(&["sandbox", "id"]).map(Cow::Owned),
                    // Operation inputs name the workspace at the top; a sandbox's own
                    // decisions under `sandbox`.
                    workspace: input
                        .text(&["sandbox", "workspace"])
                        .or_else(|| input.text(&["workspace"]))
                        .map(Cow::Owned),
                    layer: record.layer,
                    decision: record.decision,
                    decision_id: Cow::Borrowed(&record.decision_id),
                })
            }
        }
    }
}

/// The decision id an egress record is written under: its policy decision's, or for a
/// refusal made before policy, one of its own.
fn egress_decision_id(record: &DecisionRecord) -> Cow<'_, str> {
    record.policy.as_ref().map_or_else(
        || Cow::Owned(new_decision_id()),
        |p| Cow::Borrowed(p.decision_id.as_str()),
    )
}

/// The input of an egress record policy did not decide, from the record's own fields.
fn summary_input(record: &DecisionRecord) -> serde_json::Value {
    let mut request = serde_json::Map::new();
    if let Some(method) = &record.method {
        request.insert("method".into(), method.clone().into());
    }
    if let Some(path) = &record.path {
        request.insert("path".into(), path.clone().into());
    }
    let mut input = serde_json::json!({
        "phase": record.phase,
        "sandbox": {"id": record.sandbox, "workspace": record.workspace},
        "destination": {"host": record.host, "port": record.port, "ip": record.ip},
    });
    if !request.is_empty() {
        input["request"] = request.into();
    }
    input
}

#[derive(Debug, Clone)]
pub enum Sink {
    Stdout,
    Stderr,
    Off,
    File(PathBuf),
}

impl Sink {
    pub fn parse(spec: &str) -> Sink {
        match spec {
            "stdout" => Sink::Stdout,
            "stderr" => Sink::Stderr,
            "off" => Sink::Off,
            path => Sink::File(PathBuf::from(path)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct DecisionLog {
    tx: Option<mpsc::Sender<Entry>>,
    /// The ring, when nothing else reads egress records (no sink, no export): the proxy
    /// then renders each one and copies it into the ring itself. Why: handing every record
    /// to the writer thread was the ring's largest cost, more than rendering it (measured:
    /// keep-alive h1 through one worker, 42.3 µs of proxy CPU a request with records sent to
    /// the writer, 33.4 µs with the same records built and dropped where they were made,
    /// 31.9 µs with no ring), since each one's two dozen allocations were then freed on the
    /// other core and came back to the worker cold. Policy records are few (one per API
    /// operation's layer) and their rendering can fail, so they still go through the writer.
    direct: Option<Arc<DecisionRing>>,
    /// `[log] full_argv`: policy records keep an exec's argv whole.
    full_argv: bool,
}

impl DecisionLog {
    /// Starts the writer. Records are dropped (and counted) rather than blocking when the
    /// writer falls [`DECISIONS_QUEUE`] records behind.
    pub fn start(sink: Sink) -> std::io::Result<DecisionLog> {
        DecisionLog::start_with(sink, None, None, DECISIONS_QUEUE)
    }

    /// Starts the writer, which also keeps every record in `ring` and hands it to `export`
    /// (when there are), so both are fed with the sink `off`. The record is serialized once,
    /// on the writer thread, and the same bytes go to the sink, the ring and the export: the
    /// request path only queues, at most `queue` records (`[log] decisions_queue`, at
    /// least 1) before it drops them.
    pub fn start_with(
        sink: Sink,
        ring: Option<Arc<DecisionRing>>,
        export: Option<DecisionExport>,
        queue: usize,
    ) -> std::io::Result<DecisionLog> {
        let out = open_sink(&sink)?;
        if out.is_none() && ring.is_none() && export.is_none() {
            return Ok(DecisionLog {
                tx: None,
                direct: None,
                full_argv: false,
            });
        }
        let direct = ring.clone().filter(|_| out.is_none() && export.is_none());
        let (tx, rx) = mpsc::channel::<Entry>(queue.max(1));
        let scope = crate::telemetry::MetricsScope::current();
        std::thread::Builder::new()
            .name("sandgate-decision-log".into())
            .spawn(move || {
                if let Some(scope) = scope {
                    scope.enter();
                }
                let writer = Writer {
                    out,
                    ring,
                    export,
                    batch: Vec::new(),
                    scratch: Vec::new(),
                    queued: Queued::new(),
                };
                writer.run(rx);
            })?;
        Ok(DecisionLog {
            tx: Some(tx),
            direct,
            full_argv: false,
        })
    }

    /// `[log] full_argv`: log an exec's argv whole instead of [`summarize_argv`]'s summary.
    pub fn with_full_argv(mut self, full_argv: bool) -> DecisionLog {
        self.full_argv = full_argv;
        self
    }

    /// Keeps `input` for a record; it is made loggable later, on the writer thread.
    pub fn loggable(&self, input: &regorus::Value) -> LoggedInput {
        LoggedInput {
            value: input.clone(),
            full_argv: self.full_argv,
        }
    }

    /// Whether records are written at all; callers skip building one when not.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    pub fn record(&self, record: DecisionRecord) {
        match &self.direct {
            Some(ring) => file_rendered(ring, record),
            None => self.send(Entry::Record(Logged::Egress(record))),
        }
    }

    /// Queues a policy engine record (see [`PolicyRecord`]).
    pub fn record_policy(&self, record: PolicyRecord) {
        self.send(Entry::Record(Logged::Policy(record)));
    }

    /// Has every record queued so far written and exported, then stops the export (for a
    /// graceful stop: the process exits next, and the export's queue with it). Waits at most
    /// `timeout`; records queued afterwards are still written, but no longer exported.
    pub async fn close(&self, timeout: Duration) {
        let Some(tx) = &self.tx else { return };
        let (done, closed) = tokio::sync::oneshot::channel();
        let closing = async {
            if tx.send(Entry::Close(done)).await.is_ok() {
                let _ = closed.await;
            }
        };
        if tokio::time::timeout(timeout, closing).await.is_err() {
            tracing::warn!("the decision log did not finish in time; its last records may be lost");
        }
    }

    fn send(&self, entry: Entry) {
        if let Some(tx) = &self.tx {
            if tx.try_send(entry).is_err() {
                metrics::counter!("sandgate_decision_log_dropped_total").increment(1);
            }
        }
    }
}

/// Renders an egress record on the calling thread and files it in the ring; the record, its
/// input included, is freed here.
fn file_rendered(ring: &DecisionRing, record: DecisionRecord) {
    thread_local! {
        /// Where this thread renders (the ring copies the line into its arena).
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|out| {
        out.clear();
        line::egress_line(&record, &egress_decision_id(&record), out);
        let meta = Meta {
            sandbox: record.sandbox.as_deref(),
            workspace: record.workspace.as_deref(),
            layer: "egress",
            decision: record.decision,
        };
        ring.push(meta, out);
        if out.capacity() > SCRATCH_KEPT {
            *out = Vec::new();
        }
    });
}

/// Where records are written; `None` for `off`.
fn open_sink(sink: &Sink) -> std::io::Result<Option<Box<dyn Write + Send>>> {
    Ok(Some(match sink {
        Sink::Off => return Ok(None),
        Sink::Stdout => Box::new(std::io::stdout()),
        Sink::Stderr => Box::new(std::io::stderr()),
        Sink::File(path) => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )
        }
    }))
}

/// The writer thread: each record serialized once, kept in the ring, handed to the export,
/// and written to the sink with whatever else is already queued (one write and flush per
/// burst).
struct Writer {
    out: Option<Box<dyn Write + Send>>,
    ring: Option<Arc<DecisionRing>>,
    export: Option<DecisionExport>,
    /// The sink's pending lines.
    batch: Vec<u8>,
    /// Where each record is rendered ([`Writer::keep`]).
    scratch: Vec<u8>,
    queued: Queued,
}

/// `sandgate_decision_log_queued`, set after each drain. The handle is looked up once (the
/// macro hashes the name into the registry on every call) and set only when it changes.
struct Queued {
    gauge: metrics::Gauge,
    last: usize,
}

impl Queued {
    fn new() -> Queued {
        Queued {
            gauge: metrics::gauge!("sandgate_decision_log_queued"),
            last: 0,
        }
    }

    fn set(&mut self, queued: usize) {
        if queued != self.last {
            self.last = queued;
            self.gauge.set(queued as f64);
        }
    }
}

/// The largest render buffer the writer keeps between records.
const SCRATCH_KEPT: usize = 64 << 10;

/// While records keep coming, the writer sleeps this long between drains instead of parking
/// on the channel: a parked receiver is woken by every send, which on a busy proxy is a
/// futex call and a context switch per request on the cores that serve requests (measured:
/// 63 against 38 µs of proxy CPU per keep-alive request, ring on against off). A polling
/// writer is woken by none; records reach the ring, the sink and streams at most this late.
///
/// Short, because each drain runs at once everything queued since the last one, and on the
/// cores that serve requests that burst is a stall for the requests in flight: at ~40k
/// requests/s a 5 ms poll made bursts of ~1.3 ms and put keep-alive h1 p99 at 1.34–1.43 ms
/// (direct 0.34–0.37 ms); polling every 1 ms gave 0.71–0.87 ms at the same throughput, and
/// 0.5 ms gave no better p99 and 5% fewer requests/s (`cargo bench --bench egress`,
/// keepalive-h1, 2026-12-07, two runs each, interleaved).
const POLL_EVERY: Duration = Duration::from_millis(1);
/// Empty drains in a row (100 ms of nothing) after which the writer parks on the channel
/// again, so an idle gateway has no timer wake-ups either (the next record wakes it once).
const IDLE_DRAINS: u32 = 100;

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Entry>) {
        while let Some(first) = rx.blocking_recv() {
            if !self.drain_while_busy(&mut rx, first) {
                break;
            }
        }
        self.stop_export();
    }

    /// Handles `first` and everything queued after it, polling every [`POLL_EVERY`] until
    /// [`IDLE_DRAINS`] drains in a row found nothing. False once every sender is gone.
    fn drain_while_busy(&mut self, rx: &mut mpsc::Receiver<Entry>, first: Entry) -> bool {
        use tokio::sync::mpsc::error::TryRecvError;
        let mut next = Some(first);
        let mut empty = 0;
        loop {
            let got = next.is_some();
            while let Some(entry) = next.take() {
                self.handle(entry);
                next = rx.try_recv().ok();
            }
            self.write();
            self.queued.set(rx.len());
            empty = if got { 0 } else { empty + 1 };
            if empty >= IDLE_DRAINS {
                return true;
            }
            std::thread::sleep(POLL_EVERY);
            match rx.try_recv() {
                Ok(entry) => next = Some(entry),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn handle(&mut self, entry: Entry) {
        match entry {
            Entry::Record(record) => self.keep(record),
            Entry::Close(done) => {
                self.write();
                self.stop_export();
                let _ = done.send(());
            }
        }
    }

    /// Renders `record` once, into the writer's own buffer, and hands the same bytes to the
    /// export, the sink's batch and the ring (which copies them into its arena).
    fn keep(&mut self, record: Logged) {
        let mut json = std::mem::take(&mut self.scratch);
        json.clear();
        if let Ok(rendered) = record.render(&mut json) {
            let meta = rendered.meta();
            if let Some(export) = &self.export {
                export.emit(DecisionEvent {
                    decision_id: &rendered.decision_id,
                    layer: meta.layer,
                    decision: meta.decision,
                    sandbox: meta.sandbox,
                    workspace: meta.workspace,
                    json: &json,
                });
            }
            if self.out.is_some() {
                self.batch.extend_from_slice(&json);
                self.batch.push(b'\n');
            }
            if let Some(ring) = &self.ring {
                ring.push(meta, &json);
            }
        }
        // One very large record does not keep its buffer for the life of the process.
        if json.capacity() > SCRATCH_KEPT {
            json = Vec::new();
        }
        self.scratch = json;
    }

    /// Writes the pending lines to the sink.
    fn write(&mut self) {
        if let Some(out) = self.out.as_mut().filter(|_| !self.batch.is_empty()) {
            if out
                .write_all(&self.batch)
                .and_then(|_| out.flush())
                .is_err()
            {
                metrics::counter!("sandgate_decision_log_write_errors_total").increment(1);
            }
        }
        self.batch.clear();
    }

    fn stop_export(&mut self) {
        if let Some(export) = self.export.take() {
            export.shutdown();
        }
    }
}

/// A random (version 4) UUID, as OPA's `decision_id`. Drawn from a thread-local generator
/// seeded by the system: an id is made for every logged request, and a system call each
/// time showed in the keep-alive profile.
pub fn new_decision_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Header names whose values authenticate: never logged, wherever they appear in an input.
const SECRET_KEYS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "secret",
    "password",
    "token",
];

const REDACTED: &str = "[redacted]";

/// Removes secrets from an input document before it is logged. Inputs are built not to
/// hold secrets (credentials are named, proxy credentials are not shown), but policy inputs
/// grow and are sometimes built by hand (`policy eval`), so this is the last line:
/// - the value of any key named like an authenticating header (`authorization`, `cookie`,
///   `proxy-authorization`, ...) or `secret`/`password`/`token`, at any depth;
/// - credential placeholders (`sgph_…`) anywhere in a string: a placeholder is exchanged for
///   a real secret by the proxy, so it is as good as one for the sandbox that holds it;
/// - query values in any `path` (`/p?token=x` → `/p?token=`), as the egress log does.
pub fn redact_input(value: &mut serde_json::Value) {
    use serde_json::Value as J;
    match value {
        J::Object(map) => {
            // A placeholder in a key (a header name) is as much a secret as one in a value.
            let marked: Vec<String> = map
                .keys()
                .filter(|k| crate::base::scan::mentions_placeholder(k.as_bytes()))
                .cloned()
                .collect();
            for key in marked {
                if let Some(v) = map.remove(&key) {
                    map.insert(crate::base::scan::redact(&key).into_owned(), v);
                }
            }
            for (key, v) in map.iter_mut() {
                let lower = key.to_ascii_lowercase();
                if SECRET_KEYS.contains(&lower.as_str()) && !v.is_null() {
                    *v = J::String(REDACTED.into());
                    continue;
                }
                if lower == "path" {
                    if let J::String(s) = v {
                        *s = redact_query(s);
                    }
                }
                redact_input(v);
            }
        }
        J::Array(items) => items.iter_mut().for_each(redact_input),
        J::String(s) if crate::base::scan::mentions_placeholder(s.as_bytes()) => {
            *s = crate::base::scan::redact(s).into_owned();
        }
        _ => {}
    }
}

/// Replaces `input.exec.argv` (the action layer's exec input) with what identifies the
/// command without its arguments: `argv0` (the program as given), `argc` (how many strings,
/// the program included) and `argv_sha256`, the SHA-256 (lowercase hex) of every argument in
/// order, each as its length in bytes (8 bytes, big-endian) followed by its UTF-8 bytes, so
/// no two argument vectors share an encoding (`["a b"]` and `["a", "b"]` differ). Two
/// records with the same hash ran the same command; whoever knows a command can check it
/// against the hash, but the log alone does not reveal its arguments.
pub fn summarize_argv(input: &mut serde_json::Value) {
    let Some(exec) = input.get_mut("exec").and_then(|e| e.as_object_mut()) else {
        return;
    };
    let Some(serde_json::Value::Array(argv)) = exec.remove("argv") else {
        return;
    };
    let args: Vec<String> = argv
        .iter()
        .map(|a| match a {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    exec.insert(
        "argv0".into(),
        args.first()
            .cloned()
            .map_or(serde_json::Value::Null, Into::into),
    );
    exec.insert("argc".into(), args.len().into());
    exec.insert("argv_sha256".into(), argv_sha256(&args).into());
}

/// The hash [`summarize_argv`] logs.
pub fn argv_sha256<S: AsRef<str>>(argv: &[S]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for arg in argv {
        let arg = arg.as_ref().as_bytes();
        ctx.update(&(arg.len() as u64).to_be_bytes());
        ctx.update(arg);
    }
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `/path?a=1&b=x` → `/path?a=&b=`: keys stay (useful to read), values go (they carry tokens).
pub fn redact_query(path_and_query: &str) -> String {
    match path_and_query.split_once('?') {
        None => path_and_query.to_string(),
        Some((path, query)) => {
            let keys: Vec<&str> = query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|pair| pair.split_once('=').map(|(k, _)| k).unwrap_or(pair))
                .collect();
            let mut out = String::from(path);
            out.push('?');
            out.push_str(
                &keys
                    .iter()
                    .map(|k| format!("{k}="))
                    .collect::<Vec<_>>()
                    .join("&"),
            );
            out
        }
    }
}

pub fn now_rfc3339() -> String {
    crate::base::clock::rfc3339(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_removed() {
        assert_eq!(
            redact_query("/a/b?token=s3cret&x=1&flag"),
            "/a/b?token=&x=&flag="
        );
        assert_eq!(redact_query("/plain"), "/plain");
    }

    #[test]
    fn inputs_lose_authenticating_headers_placeholders_and_query_values() {
        let mut input = serde_json::json!({
            "request": {
                "method": "GET",
                "path": "/repos?access_token=abc&x=1",
                "headers": {"Authorization": "Bearer s3cret", "cookie": "sid=1",
                            "proxy-authorization": "Basic eA==", "accept": "*/*",
                            "x-custom": "token sgph_0123abcdEF-_ and more",
                            "sgph_0123abcdef9": "1"}
            },
            "list": ["sgph_aaaa", "plain"],
            "credential": {"name": "github", "secret": "never"}
        });
        redact_input(&mut input);
        let text = input.to_string();
        for secret in [
            "s3cret",
            "sid=1",
            "eA==",
            "0123abcd",
            "abcdef9",
            "sgph_aaaa",
            "never",
            "abc",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(input["request"]["headers"]["accept"], "*/*");
        assert_eq!(input["request"]["path"], "/repos?access_token=&x=");
        assert_eq!(
            input["request"]["headers"]["x-custom"],
            "token sgph_[redacted] and more"
        );
        assert_eq!(input["credential"]["name"], "github");
        assert_eq!(input["list"][1], "plain");
    }

    #[test]
    fn exec_argv_is_summarized_unless_full_argv() {
        let input = serde_json::json!({
            "operation": "exec",
            "exec": {"argv": ["curl", "-u", "user:s3cretpass", "https://x"], "cwd": "/w"},
        });
        let mut summarized = input.clone();
        summarize_argv(&mut summarized);
        let exec = &summarized["exec"];
        assert!(exec.get("argv").is_none(), "{summarized}");
        assert!(!summarized.to_string().contains("s3cretpass"));
        assert_eq!(exec["argv0"], "curl");
        assert_eq!(exec["argc"], 4);
        assert_eq!(exec["cwd"], "/w");
        assert_eq!(
            exec["argv_sha256"],
            argv_sha256(&["curl", "-u", "user:s3cretpass", "https://x"])
        );
        // The framing keeps argument boundaries: these differ.
        assert_ne!(argv_sha256(&["a b"]), argv_sha256(&["a", "b"]));
        assert_ne!(argv_sha256(&["ab", ""]), argv_sha256(&["a", "b"]));
        // A known value: SHA-256 of 8 zero bytes (one empty argument).
        assert_eq!(
            argv_sha256(&[""]),
            "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc"
        );
        // Inputs without an exec argv are left alone.
        let mut other = serde_json::json!({"exec": null, "file": {"path": "/x"}});
        summarize_argv(&mut other);
        assert_eq!(
            other,
            serde_json::json!({"exec": null, "file": {"path": "/x"}})
        );

        // The path records take: the engine's value, made loggable (and written) later.
        let engine_value = regorus::Value::from_json_str(&input.to_string()).unwrap();
        let log = DecisionLog::start(Sink::Off).unwrap();
        let written = |logged: LoggedInput| {
            let mut out = Vec::new();
            logged.write_json(&mut out);
            serde_json::from_slice::<serde_json::Value>(&out).unwrap()
        };
        assert_eq!(log.loggable(&engine_value).to_json(), summarized);
        assert_eq!(written(log.loggable(&engine_value)), summarized);
        let log = log.with_full_argv(true);
        assert_eq!(log.loggable(&engine_value).to_json(), input);
        assert_eq!(written(log.loggable(&engine_value)), input);
    }

    /// An egress record with a policy decision (so its id, and its line, are fixed).
    fn egress_record(host: &str) -> DecisionRecord {
        let input = regorus::Value::from_json_str(&format!(
            r#"{{"phase":"request","destination":{{"host":"{host}","port":443}},
               "request":{{"method":"GET","path":"/x?token=s3cret","headers":{{"accept":"*/*"}}}}}}"#
        ))
        .unwrap();
        DecisionRecord {
            ts: "2026-12-07T00:00:00Z".into(),
            kind: "egress",
            sandbox: Some("sb-1".into()),
            workspace: Some("ws-1".into()),
            phase: "request",
            protocol: "https/h1",
            host: host.into(),
            port: 443,
            ip: Some([127, 0, 0, 1].into()),
            method: Some("GET".into()),
            path: Some("/x?token=".into()),
            decision: "allow",
            code: None,
            reasons: Vec::new(),
            action: Some("inspect".into()),
            credentials: Vec::new(),
            credential_types: Vec::new(),
            policy_generation: 3,
            latency_us: 42,
            policy: Some(Arc::new(LoggedEval {
                decision_id: "0b6c0a4e-6f5e-4c1e-9a77-3c1f0f2f1a10".into(),
                input: LoggedInput {
                    value: input,
                    full_argv: false,
                },
                result: serde_json::json!({"allow": true, "deny": [], "action": "inspect"}),
            })),
            deny_mode: None,
            credential_notes: Vec::new(),
            shared: Default::default(),
        }
    }

    #[tokio::test]
    async fn with_only_the_ring_to_read_them_egress_records_are_filed_by_the_caller_as_the_writer_writes_them(
    ) {
        let limits = crate::decision_ring::RingLimits {
            max_records: 100,
            max_bytes: 1 << 20,
        };
        let record = egress_record("api.example.test");
        // Sink off, no export: the record is in the ring when `record` returns.
        let ring = DecisionRing::new(limits).unwrap();
        let log = DecisionLog::start_with(Sink::Off, Some(ring.clone()), None, 16).unwrap();
        log.record(record.clone());
        let (direct, _) = ring.page(&crate::decision_ring::Filter::default(), None, 10);
        assert_eq!(
            direct.len(),
            1,
            "filed by the caller, not later by the writer"
        );
        assert_eq!(direct[0].sandbox.as_deref(), Some("sb-1"));
        assert!(!String::from_utf8_lossy(&direct[0].json).contains("s3cret"));
        // With a sink, the writer renders it: the same bytes, in the file and in the ring.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        let ring = DecisionRing::new(limits).unwrap();
        let log = DecisionLog::start_with(Sink::File(path.clone()), Some(ring.clone()), None, 16)
            .unwrap();
        log.record(record);
        log.close(Duration::from_secs(5)).await;
        let (written, _) = ring.page(&crate::decision_ring::Filter::default(), None, 10);
        assert_eq!(written.len(), 1);
        assert_eq!(direct[0].json, written[0].json);
        let file = std::fs::read(&path).unwrap();
        assert_eq!(file, [&*written[0].json, b"\n"].concat());
    }

    #[test]
    fn decision_ids_are_version_4_uuids() {
        let a = new_decision_id();
        let b = new_decision_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!("89ab".contains(&a[19..20]));
    }
}
