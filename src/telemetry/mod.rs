//! Diagnostic logging (tracing, to stderr so stdout stays the decision log), OpenTelemetry
//! traces ([`otlp`]) and decision records as OTLP logs ([`otlp_logs`]), and the Prometheus recorder: the process-wide one, or a
//! [`MetricsScope`] of one gateway's own, both described by the [`catalog`].

pub mod catalog;
pub mod hot;
pub mod otlp;
pub mod otlp_logs;

use std::cell::Cell;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use tracing_subscriber::EnvFilter;

pub use otlp::{OtlpError, TelemetryConfig, Traces};
pub use otlp_logs::{DecisionEvent, DecisionExport};

/// Installs the tracing subscriber once (later calls are no-ops): diagnostics to stderr
/// filtered by `[log] level`, and, when `[telemetry] otlp_endpoint` is set, spans to the
/// collector. The returned [`Traces`] must be shut down to flush them.
pub fn init(config: &LogConfig, telemetry: &TelemetryConfig) -> Result<Traces, OtlpError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colour only for a person at a terminal; log files and collectors get plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt = match config.format == "json" {
        true => fmt.json().flatten_event(true).with_filter(filter).boxed(),
        false => fmt.with_filter(filter).boxed(),
    };
    let provider = otlp::provider(telemetry)?;
    let traces = match &provider {
        Some(provider) => Some(otlp::layer(provider, telemetry)?),
        None => None,
    };
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(traces)
        .try_init();
    Ok(Traces(provider))
}

/// Diagnostics only (no traces): for commands other than `serve`.
pub fn init_logging(config: &LogConfig) {
    let _ = init(config, &TelemetryConfig::default());
}

/// How often histogram samples are folded into their summaries.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds recorded histogram samples into their buckets on a timer. Without it the recorder
/// keeps every sample until `/metrics` is scraped, so a gateway nobody scrapes grows by about
/// 40 bytes per request, forever.
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("sandgate-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            handle.run_upkeep();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "metrics upkeep thread could not start; memory grows until /metrics is scraped");
    }
}

/// The Prometheus handle of the current [`MetricsScope`], else the process-wide recorder's
/// (made and installed on first use): a server takes it when it starts, so its `/metrics`
/// shows what its own threads record.
pub fn metrics_handle() -> PrometheusHandle {
    match MetricsScope::current() {
        Some(scope) => scope.0.handle.clone(),
        None => global_handle(),
    }
}

fn global_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = builder().build_recorder();
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            spawn_upkeep(handle.clone());
            handle
        })
        .clone()
}

/// A recorder builder with every catalog histogram's buckets: no latency is a summary.
fn builder() -> PrometheusBuilder {
    let mut builder = PrometheusBuilder::new();
    for family in catalog::FAMILIES {
        let Some(buckets) = family.buckets else {
            continue;
        };
        builder = match builder.set_buckets_for_metric(Matcher::Full(family.name.into()), buckets) {
            Ok(b) => b,
            // Only an empty bucket list fails; the catalog test rules that out.
            Err(_) => PrometheusBuilder::new(),
        };
    }
    builder
}

/// One gateway's own recorder, for processes that run several gateways (the integration
/// tests, each asserting exact values of its gateway's metrics while others run beside it).
///
/// A thread that entered a scope records there instead of the process-wide recorder (the
/// `metrics` crate's thread-local recorder); every thread sandgate starts for a gateway (the
/// proxy's workers, the decision-log writer, blocking work) enters the scope of the thread that
/// started it, so a gateway started inside a scope records nowhere else. `sandgate serve` never
/// makes one: a process is one gateway, and its recorder is the process-wide one.
#[derive(Clone, Copy)]
pub struct MetricsScope(&'static Scope);

struct Scope {
    recorder: metrics_exporter_prometheus::PrometheusRecorder,
    handle: PrometheusHandle,
}

thread_local! {
    static CURRENT: Cell<Option<MetricsScope>> = const { Cell::new(None) };
}

impl MetricsScope {
    /// A new, empty recorder. It lives as long as the process (a handful per test run): a
    /// scope is entered for a thread's whole life, which needs a `'static` recorder.
    #[allow(clippy::new_without_default)]
    pub fn new() -> MetricsScope {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        MetricsScope(Box::leak(Box::new(Scope { recorder, handle })))
    }

    /// The scope this thread records in, if any.
    pub fn current() -> Option<MetricsScope> {
        CURRENT.with(Cell::get)
    }

    /// This thread records in the scope from now until it ends (for threads a gateway owns).
    pub fn enter(self) {
        CURRENT.with(|c| c.set(Some(self)));
        // Forgotten on purpose: the guard would put the previous recorder back on drop,
        // and this thread belongs to the scope for the rest of its life.
        std::mem::forget(metrics::set_default_local_recorder(&self.0.recorder));
    }

    /// Runs `f` in `scope` (none: as the thread is), then puts the thread back as it was:
    /// for pooled threads that run one gateway's work now and another's later.
    pub fn run_in<T>(scope: Option<MetricsScope>, f: impl FnOnce() -> T) -> T {
        let Some(scope) = scope else { return f() };
        let previous = CURRENT.with(|c| c.replace(Some(scope)));
        let result = metrics::with_local_recorder(&scope.0.recorder, f);
        CURRENT.with(|c| c.set(previous));
        result
    }

    /// What the scope's `/metrics` would show.
    pub fn render(self) -> String {
        self.0.handle.render()
    }
}

/// A gauge that counts something live for exactly as long as this value lives, so it is
/// right however the task holding it ends (return, error, cancellation or panic).
pub struct ActiveGauge(&'static str);

impl ActiveGauge {
    pub fn new(name: &'static str) -> ActiveGauge {
        metrics::gauge!(name).increment(1.0);
        ActiveGauge(name)
    }
}

impl Drop for ActiveGauge {
    fn drop(&mut self) {
        metrics::gauge!(self.0).decrement(1.0);
    }
}

/// `[log] decisions_queue` by default: records queued for the decision log's writer at most;
/// past it the request path drops them (counted in `sandgate_decision_log_dropped_total`)
/// rather than wait or grow. A queued egress record keeps its policy input alive, so this
/// bounds what a stalled writer (a slow disk, a starved core) can hold. The writer drains
/// every 5 ms while busy, and 8,192 records are ~0.37 s of keep-alive requests at 22k/s, far
/// more than one drain finds. Measured with the sink a FIFO nobody reads, under the egress
/// bench's keep-alive load: the process grew by 157 MiB with 65,536 (the old bound; ~2.3 KiB
/// per queued record of that bench's requests) and by 28 MiB with 8,192.
pub const DECISIONS_QUEUE: usize = 8_192;

/// `[log]`: diagnostic logs and the decision log.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Where decision records go: `stdout`, `stderr`, `off`, or a file path (appended).
    pub decisions: String,
    /// Diagnostic log format on stderr: `text` or `json`.
    pub format: String,
    /// Diagnostic log filter (`RUST_LOG` syntax); the `RUST_LOG` variable wins when set.
    pub level: String,
    /// Policy decision records show an exec's argument vector whole. Off by default: they
    /// show its program, argument count and a hash (arguments carry secrets, such as
    /// `curl -u user:pass`). Policy sees the whole argv either way.
    pub full_argv: bool,
    /// Most recent decision records kept in memory for `GET /v1/decisions` and `sandgate
    /// logs` (0: no ring, the API answers 503 `decisions_unavailable`).
    pub decisions_ring: usize,
    /// Bytes those records may take (their JSON text plus a small overhead each); the oldest
    /// go first when either bound is reached. The default, 4 MiB (a few thousand records),
    /// is the ring's share of a gateway's resting memory: at 8 MiB it was the largest part
    /// of what stayed resident after 10,000 tunnels closed (+20.5 MiB over the level before
    /// they opened, against +11.7 MiB with no ring; `idle-tunnels` bench).
    pub decisions_ring_bytes: usize,
    /// Concurrent `GET /v1/decisions/stream` streams; beyond it 429 `rate_limited`.
    pub decisions_streams_max: usize,
    /// Records waiting for the decision-log writer at most; past it they are dropped and
    /// counted (`sandgate_decision_log_dropped_total`), never waited for.
    pub decisions_queue: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            decisions: "stdout".into(),
            format: "text".into(),
            level: "info".into(),
            full_argv: false,
            decisions_ring: 10_000,
            decisions_ring_bytes: 4 << 20,
            decisions_streams_max: 32,
            decisions_queue: DECISIONS_QUEUE,
        }
    }
}

#[cfg(test)]
mod scope_tests {
    use super::MetricsScope;

    fn counted(text: &str, name: &str) -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn each_scope_counts_only_what_its_threads_record() {
        let (a, b) = (MetricsScope::new(), MetricsScope::new());
        let worker = std::thread::spawn(move || {
            a.enter();
            metrics::counter!("sandgate_scope_test_total").increment(2);
            // A thread the scope's thread starts, as sandgate starts its workers.
            let inherited = MetricsScope::current();
            std::thread::spawn(move || {
                inherited.unwrap().enter();
                metrics::counter!("sandgate_scope_test_total").increment(3);
            })
            .join()
            .unwrap();
        });
        worker.join().unwrap();
        MetricsScope::run_in(Some(b), || {
            metrics::counter!("sandgate_scope_test_total").increment(7);
        });
        assert!(
            MetricsScope::current().is_none(),
            "run_in puts the thread back"
        );
        assert_eq!(counted(&a.render(), "sandgate_scope_test_total"), Some(5));
        assert_eq!(counted(&b.render(), "sandgate_scope_test_total"), Some(7));
    }
}
