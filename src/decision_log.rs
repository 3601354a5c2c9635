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
//! Records carry no header values that authenticate and no query values (those are where
//! tokens travel), only their keys. An exec's argument vector is logged as its program, its
//! length and a hash ([`summarize_argv`]), since arguments carry secrets as often as headers
//! do (`curl -u user:pass`, `mysql -pPASS`); `[log] full_argv = true` logs it whole. The
//! policy always sees it whole.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use tokio::sync::mpsc;

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
    pub ip: Option<String>,
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
}

/// A policy decision whose caller writes the log record itself (the egress proxy): what the
/// engine would have logged, handed to the caller through [`crate::policy::Decision`].
#[derive(Debug)]
pub struct LoggedEval {
    pub decision_id: String,
    /// The input exactly as evaluated, minus secrets ([`DecisionLog::redact`]).
    pub input: serde_json::Value,
    /// `{allow, deny, action, scope?}` as the policy answered, before anything the caller
    /// did after it (a dial failure, a guard refusal): replay compares against this.
    pub result: serde_json::Value,
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
    /// The input document with secrets removed ([`redact_input`]).
    pub input: serde_json::Value,
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
#[derive(Debug)]
enum Entry {
    Egress(DecisionRecord),
    Policy(PolicyRecord),
}

/// An egress record as written: its own fields, flat (what existing readers use), plus the
/// OPA fields. When policy decided, `decision_id` is the policy decision's, `input` the
/// complete input it evaluated and `policy_result` its answer (`result` is the record's
/// outcome, which a later refusal may differ from); otherwise `input` is summarised from the
/// record and there is no `policy_result` (nothing to replay). The timer is the whole
/// decision's, as OPA's `timer_server_handler_ns`. `path` keeps its older meaning here (the
/// request path, query values removed), so the package path is in `policy_path`.
#[derive(Serialize)]
struct EgressLine<'a> {
    #[serde(flatten)]
    record: &'a DecisionRecord,
    decision_id: String,
    layer: &'static str,
    policy_path: &'static str,
    input: serde_json::Value,
    result: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_result: Option<&'a serde_json::Value>,
    timestamp: &'a str,
    labels: Labels,
    metrics: EgressMetrics,
}

#[derive(Serialize)]
struct EgressMetrics {
    timer_server_handler_ns: u64,
}

impl Entry {
    fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        match self {
            Entry::Policy(record) => serde_json::to_vec(record),
            Entry::Egress(record) => {
                let input = match &record.policy {
                    Some(policy) => policy.input.clone(),
                    None => summary_input(record),
                };
                let mut result = serde_json::json!({
                    "allow": record.decision == "allow",
                    "deny": if record.decision == "allow" { Vec::new() } else { record.reasons.clone() },
                });
                if let Some(action) = &record.action {
                    result["action"] = action.clone().into();
                }
                if let Some(code) = record.code {
                    result["code"] = code.into();
                }
                serde_json::to_vec(&EgressLine {
                    record,
                    decision_id: record
                        .policy
                        .as_ref()
                        .map_or_else(new_decision_id, |p| p.decision_id.clone()),
                    layer: "egress",
                    policy_path: "sandgate/egress",
                    input,
                    result,
                    policy_result: record.policy.as_ref().map(|p| &p.result),
                    timestamp: &record.ts,
                    labels: Labels::new(record.policy_generation),
                    metrics: EgressMetrics {
                        timer_server_handler_ns: record.latency_us.saturating_mul(1000),
                    },
                })
            }
        }
    }
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
    /// `[log] full_argv`: policy records keep an exec's argv whole.
    full_argv: bool,
}

impl DecisionLog {
    /// Starts the writer. Records are dropped (and counted) rather than blocking when the
    /// writer falls 64k records behind.
    pub fn start(sink: Sink) -> std::io::Result<DecisionLog> {
        let mut out: Box<dyn Write + Send> = match &sink {
            Sink::Off => {
                return Ok(DecisionLog {
                    tx: None,
                    full_argv: false,
                })
            }
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
        };
        let (tx, mut rx) = mpsc::channel::<Entry>(65_536);
        let scope = crate::telemetry::MetricsScope::current();
        std::thread::Builder::new()
            .name("sandgate-decision-log".into())
            .spawn(move || {
                if let Some(scope) = scope {
                    scope.enter();
                }
                while let Some(record) = rx.blocking_recv() {
                    let mut line = record.to_json().unwrap_or_default();
                    line.push(b'\n');
                    // Drain what is already queued before flushing: one write per burst.
                    while let Ok(next) = rx.try_recv() {
                        if let Ok(more) = next.to_json() {
                            line.extend_from_slice(&more);
                            line.push(b'\n');
                        }
                    }
                    if out.write_all(&line).and_then(|_| out.flush()).is_err() {
                        metrics::counter!("sandgate_decision_log_write_errors_total").increment(1);
                    }
                }
            })?;
        Ok(DecisionLog {
            tx: Some(tx),
            full_argv: false,
        })
    }

    /// `[log] full_argv`: log an exec's argv whole instead of [`summarize_argv`]'s summary.
    pub fn with_full_argv(mut self, full_argv: bool) -> DecisionLog {
        self.full_argv = full_argv;
        self
    }

    /// Reduces a policy input to what may be logged: [`redact_input`], then, unless
    /// `[log] full_argv` is set, [`summarize_argv`].
    pub fn redact(&self, input: &mut serde_json::Value) {
        redact_input(input);
        if !self.full_argv {
            summarize_argv(input);
        }
    }

    /// Whether records are written at all; callers skip building one when not.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    pub fn record(&self, record: DecisionRecord) {
        self.send(Entry::Egress(record));
    }

    /// Queues a policy engine record (see [`PolicyRecord`]).
    pub fn record_policy(&self, record: PolicyRecord) {
        self.send(Entry::Policy(record));
    }

    fn send(&self, entry: Entry) {
        if let Some(tx) = &self.tx {
            if tx.try_send(entry).is_err() {
                metrics::counter!("sandgate_decision_log_dropped_total").increment(1);
            }
        }
    }
}

/// A random (version 4) UUID, as OPA's `decision_id`.
pub fn new_decision_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // Uniqueness is what matters for a log key; fall back to time and a counter.
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        b[..8].copy_from_slice(&now.to_be_bytes());
        b[8..].copy_from_slice(
            &COUNTER
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .to_be_bytes(),
        );
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
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

        let log = DecisionLog::start(Sink::Off).unwrap();
        let mut reduced = input.clone();
        log.redact(&mut reduced);
        assert_eq!(reduced, summarized);
        let mut whole = input.clone();
        log.with_full_argv(true).redact(&mut whole);
        assert_eq!(whole, input);
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
