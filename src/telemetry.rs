//! Diagnostic logging (tracing, to stderr so stdout stays the decision log) and the
//! process-wide Prometheus recorder.

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

/// The Prometheus handle; the recorder is global, so every server in a process shares it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Policy evaluation is microseconds: buckets around the 10 µs target make it a
            // real histogram (quantiles need no client-side state and aggregate).
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("sandgate_policy_eval_seconds".into()),
                    &[
                        1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 1e-1,
                    ],
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            spawn_upkeep(handle.clone());
            handle
        })
        .clone()
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
