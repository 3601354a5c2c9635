//! Diagnostic logging (tracing, to stderr so stdout stays the decision log) and the
//! Prometheus recorder: the process-wide one, or a [`MetricsScope`] of one gateway's own.

use std::cell::Cell;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use tracing_subscriber::EnvFilter;

/// Installs the tracing subscriber once; later calls are no-ops.
pub fn init_logging(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colour only for a person at a terminal; log files and collectors get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if config.format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
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

fn builder() -> PrometheusBuilder {
    // Policy evaluation is microseconds: buckets around the 10 µs target make it a real
    // histogram (quantiles need no client-side state and aggregate).
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("sandgate_policy_eval_seconds".into()),
            &[
                1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 1e-1,
            ],
        )
        .unwrap_or_else(|_| PrometheusBuilder::new())
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
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            decisions: "stdout".into(),
            format: "text".into(),
            level: "info".into(),
            full_argv: false,
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
