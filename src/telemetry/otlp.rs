//! OpenTelemetry traces over OTLP/HTTP (protobuf), off unless `[telemetry] otlp_endpoint`
//! is set.
//!
//! Contract: with an endpoint, every `tracing` span at `traces_filter` (default
//! `sandgate=info`) is exported to `{otlp_endpoint}/v1/traces` by a batch processor on its
//! own thread, under the resource `service.name = service_name` plus `resource`. The spans
//! sandgate makes: `api.request` (each API call), `sandbox.create` and its `sandbox.attempt`
//! children (pool, provider, outcome), `egress` (a proxy connection: sandbox, workspace,
//! request id) with `egress.request` (each request) and its `egress.policy`,
//! `egress.credential` and `egress.upstream` phases. No header, body or credential value is
//! an attribute. [`Traces::shutdown`] flushes what is buffered (on SIGTERM, after the
//! server stopped).

use std::collections::BTreeMap;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use serde::Deserialize;

/// `[telemetry]`: OpenTelemetry export (traces here, decision records in [`super::otlp_logs`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Base URL of an OTLP/HTTP collector (`http://collector:4318`); traces go to
    /// `{otlp_endpoint}/v1/traces`. Unset: no traces.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Further resource attributes (`deployment.environment = "prod"`, ...).
    pub resource: BTreeMap<String, String>,
    /// Which spans are exported (`RUST_LOG` syntax), apart from the `[log] level` filter.
    pub traces_filter: String,
    /// Every decision record also goes to `{otlp_endpoint}/v1/logs` as an OTLP log record
    /// ([`super::otlp_logs`]). Off by default; needs `otlp_endpoint`.
    pub otlp_logs: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "sandgate".into(),
            resource: BTreeMap::new(),
            traces_filter: "sandgate=info".into(),
            otlp_logs: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("[telemetry] otlp_endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("[telemetry] traces_filter: {0}")]
    Filter(String),
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("[telemetry] otlp_logs = true needs otlp_endpoint (the collector the records go to)")]
    LogsWithoutEndpoint,
}

/// The running trace pipeline (none when traces are off).
#[derive(Default)]
pub struct Traces(pub(super) Option<SdkTracerProvider>);

impl Traces {
    /// Exports what is buffered and stops the exporter thread. Blocks (up to the
    /// exporter's timeout): call it outside the async runtime.
    pub fn shutdown(self) {
        if let Some(provider) = self.0 {
            if let Err(e) = provider.shutdown() {
                eprintln!("sandgate: flushing traces: {e}");
            }
        }
    }
}

/// The provider exporting to the configured collector, or `None` when traces are off.
pub(super) fn provider(config: &TelemetryConfig) -> Result<Option<SdkTracerProvider>, OtlpError> {
    let Some(base) = config.otlp_endpoint.as_deref() else {
        return Ok(None);
    };
    let endpoint = signal_url(base, "traces")?;
    // The exporter builds its own reqwest client, which asks rustls for the process default
    // provider and panics when none is installed yet (init runs before the server does).
    crate::tls::install_default_provider();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| OtlpError::Exporter(e.to_string()))?;
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource(config))
            .build(),
    ))
}

/// `service.name` and `[telemetry] resource`: the same for every signal sandgate exports.
pub(super) fn resource(config: &TelemetryConfig) -> Resource {
    Resource::builder()
        .with_service_name(config.service_name.clone())
        .with_attributes(
            config
                .resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

/// `{base}/v1/{signal}`, for an `http`/`https` URL with a host.
pub(super) fn signal_url(base: &str, signal: &str) -> Result<String, OtlpError> {
    let bad = |reason: &str| OtlpError::Endpoint {
        endpoint: base.to_string(),
        reason: reason.to_string(),
    };
    let url = url::Url::parse(base).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad("must be an http:// or https:// URL with a host"));
    }
    if url.query().is_some() || !url.username().is_empty() {
        return Err(bad("must not carry a query or credentials"));
    }
    Ok(format!("{}/v1/{signal}", base.trim_end_matches('/')))
}

/// The `tracing` layer sending spans to `provider`, filtered by `traces_filter`.
pub(super) fn layer<S>(
    provider: &SdkTracerProvider,
    config: &TelemetryConfig,
) -> Result<impl tracing_subscriber::Layer<S>, OtlpError>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_new(&config.traces_filter)
        .map_err(|e| OtlpError::Filter(e.to_string()))?;
    let tracer = provider.tracer("sandgate");
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter))
}

#[cfg(test)]
mod tests {
    use super::signal_url;

    fn traces_url(base: &str) -> Result<String, super::OtlpError> {
        signal_url(base, "traces")
    }

    #[test]
    fn endpoint_is_a_plain_http_url() {
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        for bad in [
            "collector:4318",
            "ftp://c/",
            "http://u:p@c/",
            "http://c/?x=1",
            "",
        ] {
            let e = traces_url(bad).unwrap_err().to_string();
            assert!(!e.contains("u:p") || bad.contains("u:p"), "{e}");
            assert!(e.starts_with("[telemetry] otlp_endpoint"), "{e}");
        }
    }
}
