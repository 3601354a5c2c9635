//! gRPC calls to Modal with tonic: a lazily connected channel per URL over sandgate's own
//! TLS settings, the SDK's metadata, deadlines, and failures read into [`GrpcFailure`].
//!
//! Contract:
//! - The channel speaks HTTP/2 over hyper-rustls with the adapter's `rustls` trust (ALPN
//!   `h2`), so a test's CA and a deployment's roots apply as for every hosted adapter;
//!   `http://` URLs (a fake, a local server) are h2c.
//! - Every call carries the metadata [`Meta`] holds (the control plane's
//!   `x-modal-token-id`/`x-modal-token-secret`, or the command router's `authorization:
//!   Bearer`), `x-modal-client-type`/`x-modal-client-version` as the SDK release whose
//!   schema this adapter speaks, and, when given, `x-idempotency-key` (the SDK sends one per
//!   logical call, the same on its retries).
//! - A failure says whether the request may have reached Modal ([`GrpcFailure::sent`]):
//!   a connection that was never made is not sent; a reset, a timeout or any status is.
//!   Secrets never appear in a failure's message (tonic's messages carry no metadata).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::uri::PathAndQuery;
use prost::Message;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use super::proto;
use crate::credentials::Secret;

/// The SDK release whose schema and metadata this adapter speaks.
pub const CLIENT_VERSION: &str = "1.6.4";
/// `modal.client.ClientType.CLIENT_TYPE_CLIENT`.
const CLIENT_TYPE: &str = "1";

/// A failed call.
#[derive(Debug, Clone)]
pub struct GrpcFailure {
    /// The status Modal (or the transport) answered; `None` when the channel never connected.
    pub code: Option<Code>,
    pub message: String,
    /// The server's `RPCRetryPolicy`, when it attached one (a throttled call).
    pub retry_after: Option<Duration>,
    /// The request may have reached Modal.
    pub sent: bool,
}

impl GrpcFailure {
    fn from_status(status: tonic::Status) -> GrpcFailure {
        let never_sent = never_connected(&status);
        GrpcFailure {
            code: (!never_sent).then_some(status.code()),
            message: format!(
                "modal answered {:?}: {}",
                status.code(),
                status.message().chars().take(300).collect::<String>()
            ),
            retry_after: retry_policy(status.details()),
            sent: !never_sent,
        }
    }

    /// No answer within the deadline: the request was sent.
    fn timed_out(after: Duration) -> GrpcFailure {
        GrpcFailure {
            code: Some(Code::DeadlineExceeded),
            message: format!("modal did not answer within {}s", after.as_secs()),
            retry_after: None,
            sent: true,
        }
    }
}

/// Whether a transport failure happened before any byte of the request left: the TCP or TLS
/// connection was never made (hyper-util's `ConnectError`, a refused or unreachable peer).
fn never_connected(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused | AddrNotAvailable | NotFound | HostUnreachable
            ) {
                return true;
            }
        }
        let text = e.to_string();
        if text.contains("tcp connect error") || text.contains("dns error") {
            return true;
        }
        source = e.source();
    }
    false
}

/// The `RPCRetryPolicy` in a status's `grpc-status-details-bin` (an `RPCStatus`).
pub fn retry_policy(details: &[u8]) -> Option<Duration> {
    if details.is_empty() {
        return None;
    }
    let status = proto::RpcStatus::decode(details).ok()?;
    status
        .details
        .iter()
        .filter(|d| d.type_url.ends_with(proto::RETRY_POLICY_TYPE))
        .find_map(|d| proto::RpcRetryPolicy::decode(d.value.as_slice()).ok())
        .map(|p| Duration::from_secs_f32(p.retry_after_secs.clamp(0.1, 3600.0)))
}

/// `url` as a tonic endpoint with the adapter's connect and keep-alive settings.
fn endpoint(url: &str) -> Result<Endpoint, String> {
    Ok(Endpoint::from_shared(url.to_string())
        .map_err(|e| format!("not a URL modal can be reached at ({url}): {e}"))?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true))
}

/// A lazily connected HTTP/2 channel to `endpoint` with the adapter's TLS trust. It must be
/// made inside the runtime: tonic spawns the channel's worker there.
fn channel(endpoint: &Endpoint, tls: &rustls::ClientConfig) -> Channel {
    // hyper-rustls sets ALPN itself (`h2` alone, from `enable_http2`) and refuses a config
    // that already names protocols.
    let mut tls = tls.clone();
    tls.alpn_protocols.clear();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http);
    endpoint.connect_with_connector_lazy(connector)
}

/// The metadata every call on one channel carries.
#[derive(Clone)]
pub struct Meta {
    pairs: Vec<(&'static str, AsciiMetadataValue)>,
}

impl Meta {
    /// The control plane's: the account's token id and secret.
    pub fn tokens(token_id: &str, token_secret: &Secret) -> Result<Meta, String> {
        let value = |name: &str, v: &str| {
            AsciiMetadataValue::try_from(v).map_err(|_| format!("the {name} is not ASCII text"))
        };
        let mut secret = value("token secret", token_secret.expose())?;
        secret.set_sensitive(true);
        Ok(Meta::with(vec![
            ("x-modal-token-id", value("token id", token_id)?),
            ("x-modal-token-secret", secret),
        ]))
    }

    /// The command router's: the task's JWT.
    pub fn bearer(jwt: &str) -> Result<Meta, String> {
        let mut value = AsciiMetadataValue::try_from(format!("Bearer {jwt}"))
            .map_err(|_| "modal's command router token is not ASCII text".to_string())?;
        value.set_sensitive(true);
        Ok(Meta::with(vec![("authorization", value)]))
    }

    fn with(mut pairs: Vec<(&'static str, AsciiMetadataValue)>) -> Meta {
        pairs.push((
            "x-modal-client-version",
            AsciiMetadataValue::from_static(CLIENT_VERSION),
        ));
        pairs.push((
            "x-modal-client-type",
            AsciiMetadataValue::from_static(CLIENT_TYPE),
        ));
        Meta { pairs }
    }

    fn apply(&self, map: &mut MetadataMap, idempotency_key: Option<&str>) {
        for (name, value) in &self.pairs {
            map.insert(*name, value.clone());
        }
        if let Some(key) = idempotency_key.and_then(|k| AsciiMetadataValue::try_from(k).ok()) {
            map.insert("x-idempotency-key", key);
        }
    }
}

/// One gRPC endpoint with its metadata.
#[derive(Clone)]
pub struct Rpc {
    target: Arc<Target>,
    meta: Meta,
}

/// Where an [`Rpc`] connects, and its channel once the first call made it.
struct Target {
    endpoint: Endpoint,
    tls: rustls::ClientConfig,
    channel: OnceLock<Channel>,
}

impl Rpc {
    /// Checks `url` now and connects on the first call, so an adapter can be built outside
    /// the runtime (`sandgate provider check` builds its account before starting one).
    pub fn new(url: &str, tls: &rustls::ClientConfig, meta: Meta) -> Result<Rpc, String> {
        let target = Target {
            endpoint: endpoint(url)?,
            tls: tls.clone(),
            channel: OnceLock::new(),
        };
        Ok(Rpc {
            target: Arc::new(target),
            meta,
        })
    }

    fn channel(&self) -> Channel {
        let t = &self.target;
        t.channel
            .get_or_init(|| channel(&t.endpoint, &t.tls))
            .clone()
    }

    /// A unary call, bounded by `deadline` (sent as `grpc-timeout` too). A call the
    /// connection broke under (tonic's status then carries the transport's error, not an
    /// answer: the next call on a channel whose connection just dropped fails this way) is
    /// sent once more on a fresh connection, as the SDK retries such calls; except a call with
    /// an idempotency key (a create), whose unknown outcome the coordinator reconciles by tag.
    pub async fn unary<Q, R>(
        &self,
        path: &'static str,
        request: Q,
        idempotency_key: Option<&str>,
        deadline: Duration,
    ) -> Result<R, GrpcFailure>
    where
        Q: Message + Clone + Send + Sync + 'static,
        R: Message + Default + Send + Sync + 'static,
    {
        let retry = idempotency_key.is_none();
        match self
            .unary_once(path, request.clone(), idempotency_key, deadline)
            .await
        {
            Err((_, true)) if retry => self
                .unary_once(path, request, idempotency_key, deadline)
                .await
                .map_err(|(failure, _)| failure),
            other => other.map_err(|(failure, _)| failure),
        }
    }

    /// One try of [`Rpc::unary`]: the failure, and whether the transport broke under it.
    async fn unary_once<Q, R>(
        &self,
        path: &'static str,
        request: Q,
        idempotency_key: Option<&str>,
        deadline: Duration,
    ) -> Result<R, (GrpcFailure, bool)>
    where
        Q: Message + Send + Sync + 'static,
        R: Message + Default + Send + Sync + 'static,
    {
        let call = async {
            let mut grpc = tonic::client::Grpc::new(self.channel());
            grpc.ready().await.map_err(|e| {
                let failure = GrpcFailure {
                    code: None,
                    message: format!("modal cannot be reached: {e}"),
                    retry_after: None,
                    sent: false,
                };
                (failure, false)
            })?;
            let mut request = tonic::Request::new(request);
            request.set_timeout(deadline);
            self.meta.apply(request.metadata_mut(), idempotency_key);
            let codec = tonic_prost::ProstCodec::<Q, R>::default();
            grpc.unary(request, PathAndQuery::from_static(path), codec)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| {
                    let broken = std::error::Error::source(&status).is_some();
                    (GrpcFailure::from_status(status), broken)
                })
        };
        // tonic enforces `grpc-timeout` on its side too; this bound also covers the connect.
        tokio::time::timeout(deadline + Duration::from_secs(1), call)
            .await
            .unwrap_or_else(|_| Err((GrpcFailure::timed_out(deadline), false)))
    }

    /// A server-streaming call: the stream of answers once the server accepted the call.
    pub async fn server_stream<Q, R>(
        &self,
        path: &'static str,
        request: Q,
        deadline: Option<Duration>,
    ) -> Result<tonic::Streaming<R>, GrpcFailure>
    where
        Q: Message + Send + Sync + 'static,
        R: Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel());
        grpc.ready().await.map_err(|e| GrpcFailure {
            code: None,
            message: format!("modal cannot be reached: {e}"),
            retry_after: None,
            sent: false,
        })?;
        let mut request = tonic::Request::new(request);
        if let Some(deadline) = deadline {
            request.set_timeout(deadline);
        }
        self.meta.apply(request.metadata_mut(), None);
        let codec = tonic_prost::ProstCodec::<Q, R>::default();
        grpc.server_streaming(request, PathAndQuery::from_static(path), codec)
            .await
            .map(tonic::Response::into_inner)
            .map_err(GrpcFailure::from_status)
    }
}
