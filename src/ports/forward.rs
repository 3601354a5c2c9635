//! Forwarding an admitted request to the port inside the sandbox, over a connection of its
//! own, and splicing an upgraded (WebSocket) connection both ways.

use std::net::SocketAddr;

use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::egress::ProxyBody;
use crate::error::{Error, Kind};

/// Sends `request` to the sandbox's port over `upstream` and returns its answer; a 101 to
/// an upgrade request is then spliced with the client until either side closes.
pub(super) async fn forward(
    mut request: Request<Incoming>,
    upstream: TcpStream,
    peer: SocketAddr,
) -> Result<Response<ProxyBody>, Error> {
    let client_upgrade =
        crate::egress::is_upgrade(&request).then(|| hyper::upgrade::on(&mut request));
    add_forwarded(&mut request, peer);
    // The server gets the origin form (`/path?query`), whatever form the client sent.
    let origin_form = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static("/"));
    *request.uri_mut() = origin_form;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(upstream))
        .await
        .map_err(failed)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "connection to a sandbox port ended with an error");
        }
    });
    let mut response = sender.send_request(request).await.map_err(failed)?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client) = client_upgrade {
            let server = hyper::upgrade::on(&mut response);
            tokio::spawn(splice(client, server));
        }
    } else {
        own_hop(&mut response);
    }
    Ok(response.map(|body| body.map_err(Into::into).boxed()))
}

/// The client's connection is a hop of its own: the server's connection headers (an
/// HTTP/1.0 server's implicit close, `Connection: close`, `Keep-Alive`) do not end it.
fn own_hop(response: &mut Response<Incoming>) {
    *response.version_mut() = Version::HTTP_11;
    let headers = response.headers_mut();
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    headers.remove(header::CONNECTION);
    headers.remove("keep-alive");
}

/// `X-Forwarded-For` (the client's address appended), `-Proto` and `-Host`, so the server
/// in the sandbox can tell who called and which URL it was called by.
fn add_forwarded(request: &mut Request<Incoming>, peer: SocketAddr) {
    let host = request.headers().get(header::HOST).cloned();
    let headers = request.headers_mut();
    let chain = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(earlier) => format!("{earlier}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(value) = HeaderValue::from_str(&chain) {
        headers.insert("x-forwarded-for", value);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("https"));
    if let Some(host) = host {
        headers.insert("x-forwarded-host", host);
    }
}

/// Copies both ways between the upgraded client and server connections.
async fn splice(client: hyper::upgrade::OnUpgrade, server: hyper::upgrade::OnUpgrade) {
    let (client, server) = match tokio::try_join!(client, server) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "a sandbox port upgrade did not complete");
            return;
        }
    };
    let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
        tracing::debug!(error = %e, "an upgraded sandbox port connection ended with an error");
    }
}

fn failed(e: hyper::Error) -> Error {
    Error::new(
        Kind::Upstream,
        "port_failed",
        format!("the server on the sandbox port failed to answer: {e}"),
    )
}
