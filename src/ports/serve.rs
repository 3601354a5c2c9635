//! The ports listener: accept within the connection limit, TLS, then each request named,
//! authorized and forwarded (see the module contract in [`super`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::host::{self, HostError, Target};
use super::Gateway;
use crate::config::PortsConfig;
use crate::egress::ProxyBody;
use crate::error::{Error, Kind};

/// The headers a token may come in (sandgate's, and the one E2B's SDKs and docs use);
/// neither is forwarded.
pub(crate) const TOKEN_HEADERS: [&str; 2] = ["x-sandgate-port-token", "e2b-traffic-access-token"];

/// The listener's limits (`[ports]`).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    max_connections: usize,
    header_read_timeout: Duration,
}

impl From<&PortsConfig> for Limits {
    fn from(config: &PortsConfig) -> Limits {
        Limits {
            max_connections: config.max_connections,
            header_read_timeout: Duration::from_secs(config.header_read_timeout_secs),
        }
    }
}

/// Accepts clients until the task is aborted.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    gateway: Arc<Gateway>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(gateway.limits.max_connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "ports listener accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics::counter!("sandgate_port_connections_shed_total").increment(1);
            continue;
        };
        // Answers go out as they come (a response head and its body are separate writes).
        let _ = stream.set_nodelay(true);
        let (acceptor, gateway) = (acceptor.clone(), gateway.clone());
        tokio::spawn(async move {
            serve_client(stream, peer, acceptor, gateway).await;
            drop(slot);
        });
    }
}

/// One client connection: the handshake within the timeout, then HTTP/1.1 requests, each
/// checked against the server name the handshake carried.
async fn serve_client(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    gateway: Arc<Gateway>,
) {
    let timeout = gateway.limits.header_read_timeout;
    let tls = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "ports client handshake failed");
            count("handshake_failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "ports client did not complete its handshake in time");
            count("handshake_failed");
            return;
        }
    };
    let sni: Option<Arc<str>> = tls.get_ref().1.server_name().map(Arc::from);
    let service = hyper::service::service_fn(move |request| {
        let (gateway, sni) = (gateway.clone(), sni.clone());
        async move { Ok::<_, Infallible>(answer(&gateway, sni.as_deref(), peer, request).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    let conn = builder
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "ports client connection ended with an error");
    }
}

/// One request's answer: forwarded, or the refusal in sandgate's error shape.
async fn answer(
    gateway: &Gateway,
    sni: Option<&str>,
    peer: SocketAddr,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    match route(gateway, sni, peer, request).await {
        Ok(response) => {
            count("forwarded");
            response
        }
        Err(e) => {
            count(outcome_of(&e));
            tracing::debug!(%peer, code = e.code, "ports request refused");
            crate::reply::ErrorReply::api(e)
                .to_response::<Full<Bytes>>()
                .map(|body| body.map_err(|never| match never {}).boxed())
        }
    }
}

async fn route(
    gateway: &Gateway,
    sni: Option<&str>,
    peer: SocketAddr,
    mut request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Error> {
    let target = target(gateway, sni, &request)?;
    let token = take_token(request.headers_mut())?;
    let upstream = crate::operations::ports::connect(
        &gateway.ops,
        &target.sandbox,
        target.port,
        token.as_deref(),
    )
    .await?;
    super::forward::forward(request, upstream, peer).await
}

/// The port and sandbox the request is for: its `Host` (and the authority of an
/// absolute-form target), which must name what the connection's TLS server name named.
fn target(
    gateway: &Gateway,
    sni: Option<&str>,
    request: &Request<Incoming>,
) -> Result<Target, Error> {
    let invalid = |e: HostError| Error::new(Kind::Invalid, "invalid_host", e.to_string());
    let sni = sni.ok_or_else(|| {
        Error::new(
            Kind::Misdirected,
            "misdirected",
            "the TLS handshake named no server: connect by the port's host name",
        )
    })?;
    let from_sni = host::parse(sni, &gateway.domain).map_err(invalid)?;
    let named = request
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let from_host = host::parse(named, &gateway.domain).map_err(invalid)?;
    // An absolute-form request names its target a second time: it must agree too.
    let from_uri = match request.uri().authority() {
        Some(authority) => Some(host::parse(authority.as_str(), &gateway.domain).map_err(invalid)?),
        None => None,
    };
    if from_host != from_sni || from_uri.is_some_and(|t| t != from_sni) {
        return Err(Error::new(
            Kind::Misdirected,
            "misdirected",
            "the request names another port or sandbox than the TLS server name",
        ));
    }
    Ok(from_host)
}

/// Removes every token header; the token, when exactly one distinct value was sent.
fn take_token(headers: &mut HeaderMap) -> Result<Option<String>, Error> {
    let mut values = Vec::new();
    for name in TOKEN_HEADERS {
        let name = HeaderName::from_static(name);
        values.extend(headers.get_all(&name).iter().cloned());
        headers.remove(&name);
    }
    values.dedup();
    match values.as_slice() {
        [] => Ok(None),
        [one] => match one.to_str() {
            Ok(text) => Ok(Some(text.trim().to_string())),
            Err(_) => Err(bad_token()),
        },
        _ => Err(bad_token()),
    }
}

fn bad_token() -> Error {
    Error::new(
        Kind::Unauthenticated,
        "port_token_invalid",
        "send one port token, in X-Sandgate-Port-Token",
    )
}

/// The metric outcome of a refusal (a fixed set).
fn outcome_of(e: &Error) -> &'static str {
    match e.kind {
        Kind::Invalid | Kind::Misdirected => "bad_request",
        Kind::Unauthenticated => "unauthenticated",
        Kind::Refused | Kind::Forbidden => "refused",
        Kind::NotFound => "not_found",
        Kind::Conflict => "sandbox_state",
        Kind::Unsupported => "unsupported",
        Kind::Upstream | Kind::UpstreamTimeout => "upstream_failed",
        _ => "error",
    }
}

fn count(outcome: &'static str) {
    metrics::counter!("sandgate_port_requests_total", "outcome" => outcome).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_headers_are_taken_out_and_must_agree() {
        let mut headers = HeaderMap::new();
        headers.insert("x-sandgate-port-token", "sgp_1".parse().unwrap());
        headers.insert("e2b-traffic-access-token", "sgp_1".parse().unwrap());
        headers.insert("authorization", "Bearer app".parse().unwrap());
        assert_eq!(take_token(&mut headers).unwrap().as_deref(), Some("sgp_1"));
        assert_eq!(headers.len(), 1, "{headers:?}");
        headers.append("x-sandgate-port-token", "sgp_1".parse().unwrap());
        headers.append("x-sandgate-port-token", "sgp_2".parse().unwrap());
        assert_eq!(
            take_token(&mut headers).unwrap_err().code,
            "port_token_invalid"
        );
        assert!(!headers.contains_key("x-sandgate-port-token"));
        assert_eq!(take_token(&mut headers).unwrap(), None);
    }
}
