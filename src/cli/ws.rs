//! The CLI's WebSocket connection (`sandgate sandbox shell`): `ws://` in the clear,
//! `wss://` over TLS verified exactly as the CLI's HTTP calls are (reqwest's
//! `rustls-platform-verifier`: the system's trust store, which honours `SSL_CERT_FILE` and
//! `SSL_CERT_DIR` on Linux), with the gateway's host name checked against its certificate.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::error::UrlError;
use tokio_tungstenite::tungstenite::handshake::client::{Request, Response};
use tokio_tungstenite::tungstenite::Error;
use tokio_tungstenite::WebSocketStream;

/// A connection to the gateway, in the clear or over TLS.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub(super) type Socket = WebSocketStream<Box<dyn Io>>;

/// Opens the WebSocket `request` names (`ws://` or `wss://`).
pub(super) async fn connect(request: Request) -> Result<(Socket, Response), Error> {
    let uri = request.uri();
    let secure = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") => true,
        _ => return Err(Error::Url(UrlError::UnsupportedUrlScheme)),
    };
    let host = uri
        .host()
        .ok_or(Error::Url(UrlError::NoHostName))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    tcp.set_nodelay(true)?;
    let stream: Box<dyn Io> = if secure {
        Box::new(tls(tcp, &host).await?)
    } else {
        Box::new(tcp)
    };
    tokio_tungstenite::client_async(request, stream).await
}

async fn tls(
    tcp: TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Error> {
    let config = client_config().map_err(|e| Error::Io(std::io::Error::other(e)))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| Error::Url(UrlError::NoHostName))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    Ok(stream)
}

/// What reqwest builds for the CLI's HTTP calls: the platform verifier on ring.
fn client_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    // A WebSocket upgrade is HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
