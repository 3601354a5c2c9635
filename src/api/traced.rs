//! Per-request telemetry for the API: an `api.request` span (method, matched route, status;
//! never the raw path, which carries ids, nor headers) and the
//! `sandgate_api_request_seconds{status_class}` histogram.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// Wraps one API request in its span and records its latency.
pub async fn request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str());
    let span = tracing::info_span!(
        "api.request",
        http.request.method = %request.method(),
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        request_id = request
            .headers()
            .get(super::request_id::HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default(),
    );
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    metrics::histogram!("sandgate_api_request_seconds", "status_class" => status_class(status))
        .record(started.elapsed().as_secs_f64());
    response
}

/// A status's class: a label with five values, not one per status code.
fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
