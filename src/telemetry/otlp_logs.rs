//! Decision records as OpenTelemetry log records over OTLP/HTTP (protobuf), off unless
//! `[telemetry] otlp_logs = true` (which needs `otlp_endpoint`).
//!
//! Contract: the decision log's writer thread (`crate::decision_log`) hands every record it
//! serialized to [`DecisionExport::emit`]; nothing on the request path calls it. Each becomes
//! one log record, sent to `{otlp_endpoint}/v1/logs` under the same resource as the traces:
//! - event name `sandgate.decision`;
//! - body: the record's JSON text, the exact bytes the decision log writes and
//!   `GET /v1/decisions` returns, so it is redacted the same way (no authenticating header,
//!   query value or placeholder; an exec's argv summarized) and nothing else is added;
//! - attributes `decision_id`, `layer`, `decision`, and `sandbox` and `workspace` when the
//!   record names them;
//! - severity `INFO` for `allow`, `WARN` for any refusal (`deny`, `error`, ...).
//!
//! The SDK's batch processor queues records (2048 at most; beyond that it drops them) and
//! exports from its own thread, so a slow or absent collector never holds the writer, let
//! alone a request. [`DecisionExport::shutdown`] exports what is queued; the writer calls it
//! when the server stops (`crate::server::Server::stop`).

use std::time::{Duration, SystemTime};

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};

use super::otlp::{resource, signal_url, OtlpError, TelemetryConfig};

/// The event name of every exported decision record.
pub const EVENT_NAME: &str = "sandgate.decision";

/// How long [`DecisionExport::shutdown`] may take to export what is queued.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// One decision record, as the writer thread has it after serializing it.
pub struct DecisionEvent<'a> {
    pub decision_id: &'a str,
    pub layer: &'static str,
    pub decision: &'static str,
    pub sandbox: Option<&'a str>,
    pub workspace: Option<&'a str>,
    /// The record's JSON text.
    pub json: &'a [u8],
}

/// The running export of decision records (see the module documentation).
pub struct DecisionExport {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
}

impl DecisionExport {
    /// The export `config` asks for, or `None` when `otlp_logs` is off. The HTTP client is
    /// built on a thread of its own by the exporter, so this may run inside the runtime.
    pub fn start(config: &TelemetryConfig) -> Result<Option<DecisionExport>, OtlpError> {
        if !config.otlp_logs {
            return Ok(None);
        }
        let base = config
            .otlp_endpoint
            .as_deref()
            .ok_or(OtlpError::LogsWithoutEndpoint)?;
        let endpoint = signal_url(base, "logs")?;
        // As for traces: the exporter's reqwest client needs the process's rustls provider.
        crate::tls::install_default_provider();
        let exporter = opentelemetry_otlp::LogExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| OtlpError::Exporter(e.to_string()))?;
        let provider = SdkLoggerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource(config))
            .build();
        let logger = provider.logger("sandgate");
        Ok(Some(DecisionExport { provider, logger }))
    }

    /// Queues `event` for export; never blocks (a full queue drops it).
    pub fn emit(&self, event: DecisionEvent<'_>) {
        let severity = match event.decision {
            "allow" => Severity::Info,
            _ => Severity::Warn,
        };
        let mut record = self.logger.create_log_record();
        record.set_event_name(EVENT_NAME);
        record.set_timestamp(SystemTime::now());
        record.set_severity_number(severity);
        record.set_severity_text(severity.name());
        let body = String::from_utf8_lossy(event.json).into_owned();
        record.set_body(AnyValue::String(body.into()));
        record.add_attribute("decision_id", event.decision_id.to_string());
        record.add_attribute("layer", event.layer);
        record.add_attribute("decision", event.decision);
        if let Some(sandbox) = event.sandbox {
            record.add_attribute("sandbox", sandbox.to_string());
        }
        if let Some(workspace) = event.workspace {
            record.add_attribute("workspace", workspace.to_string());
        }
        self.logger.emit(record);
    }

    /// Exports what is queued and stops the export thread. Blocks up to
    /// [`SHUTDOWN_TIMEOUT`]: call it from the writer thread, not the runtime.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(error = %e, "exporting the last decision records over OTLP");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_needs_an_endpoint() {
        let mut config = TelemetryConfig::default();
        assert!(DecisionExport::start(&config).unwrap().is_none());
        config.otlp_logs = true;
        let e = DecisionExport::start(&config).err().expect("no endpoint");
        assert!(e.to_string().contains("otlp_endpoint"), "{e}");
        config.otlp_endpoint = Some("collector:4318".into());
        let e = DecisionExport::start(&config).err().expect("not a URL");
        assert!(
            e.to_string().starts_with("[telemetry] otlp_endpoint"),
            "{e}"
        );
    }
}
