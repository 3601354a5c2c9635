//! Commands and files through Prime's sandbox gateway (`{gateway_url}/{user_ns}/{job_id}`,
//! a per-sandbox bearer token): the Connect server stream `CommandSession/Start` with the
//! protobuf codec, `CommandSession/SendSignal` to kill, `/upload` and `/download`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use reqwest::{Method, RequestBuilder, Response};
use serde_json::Value;
use tokio::sync::{mpsc, Notify};

use super::proto::{self, Event};
use super::wire::GatewayAuth;
use super::{op_error, Prime};
use crate::e2b::connect as connect_rpc;
use crate::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason};
use crate::providers::hosted::http::{HttpFailure, ProviderHttp};
use crate::providers::hosted::tags::uuid_v4;
use crate::providers::{OpError, OpErrorKind};

const START: &str = "command_session.CommandSession/Start";
const SEND_SIGNAL: &str = "command_session.CommandSession/SendSignal";
const STREAM_TYPE: &str = "application/connect+proto";
const UNARY_TYPE: &str = "application/proto";
/// A command without a timeout may run this long before the HTTP client gives up.
const NO_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A failure the gateway answered: a sandbox it no longer serves is a conflict (the
/// sandbox is not running), not a missing file.
fn gateway_error(failure: HttpFailure) -> OpError {
    let said = failure.field("error").unwrap_or_default();
    if said == "sandbox_not_found" || said == "sandbox_terminated" {
        return OpError::new(
            OpErrorKind::Conflict,
            format!("prime-intellect's gateway no longer serves this sandbox ({said})"),
        );
    }
    op_error(failure)
}

/// A Connect error from the end of a stream.
#[derive(Debug)]
struct RpcFailure {
    code: String,
    message: String,
}

impl RpcFailure {
    fn op_error(&self) -> OpError {
        let kind = match self.code.as_str() {
            "invalid_argument" | "out_of_range" => OpErrorKind::Invalid,
            "not_found" | "failed_precondition" | "aborted" => OpErrorKind::Conflict,
            "unimplemented" => OpErrorKind::Unsupported,
            _ => OpErrorKind::Provider,
        };
        OpError::new(
            kind,
            format!(
                "prime-intellect's command failed ({}): {}",
                self.code,
                self.message.chars().take(300).collect::<String>()
            ),
        )
    }
}

/// What the stream delivered next.
enum Item {
    Event(Event),
    /// The end of the stream, without error.
    Done,
}

/// The messages of one `Start` stream, whatever the chunking.
struct Events {
    response: Response,
    decoder: connect_rpc::Decoder,
    ended: bool,
}

impl Events {
    async fn next(&mut self) -> Result<Item, RpcFailure> {
        let broken = |message: String| RpcFailure {
            code: "internal".into(),
            message,
        };
        loop {
            if self.ended {
                return Ok(Item::Done);
            }
            match self.decoder.next_frame() {
                Ok(Some(frame)) if frame.is_end() => {
                    self.ended = true;
                    let body: Value = serde_json::from_slice(&frame.payload).unwrap_or_default();
                    return match body.get("error") {
                        Some(error) => Err(RpcFailure {
                            code: error["code"].as_str().unwrap_or("unknown").to_string(),
                            message: error["message"].as_str().unwrap_or_default().to_string(),
                        }),
                        None => Ok(Item::Done),
                    };
                }
                Ok(Some(frame)) if frame.flags & connect_rpc::COMPRESSED != 0 => {
                    return Err(broken("a compressed message was not asked for".into()))
                }
                Ok(Some(frame)) => {
                    return proto::read_event(&frame.payload)
                        .map(Item::Event)
                        .map_err(|e| broken(e.to_string()))
                }
                Ok(None) => {}
                Err(e) => return Err(broken(e.to_string())),
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.decoder.push(&chunk),
                Ok(None) => {
                    self.ended = true;
                    return Err(broken("the stream ended without its end message".into()));
                }
                Err(e) => {
                    self.ended = true;
                    return Err(broken(format!("the stream broke: {e}")));
                }
            }
        }
    }
}

/// Sends SIGKILL to a command session (best effort: a failure is logged).
async fn kill(http: ProviderHttp, auth: GatewayAuth, session: String) {
    let url = format!("{}/{SEND_SIGNAL}", auth.base());
    let body = proto::send_signal_request(&session, proto::SIGNAL_SIGKILL, &uuid_v4());
    let request = http
        .request_plain(Method::POST, &url)
        .bearer_auth(&auth.token)
        .header(http::header::CONTENT_TYPE, UNARY_TYPE)
        .header("Connect-Protocol-Version", "1")
        .body(body);
    if let Err(e) = http.send(request).await {
        tracing::warn!(error = %e.message, "prime-intellect: killing a command failed");
    }
}

/// How a command ended, from its `end` event.
fn exit_of(exit_code: i32, exited: bool) -> ExitInfo {
    if exited {
        return ExitInfo {
            code: Some(exit_code),
            signal: None,
            reason: ExitReason::Exited,
        };
    }
    // Killed: the code carries the signal (128 + N, or -N).
    let signal = match exit_code {
        129..=192 => Some(exit_code - 128),
        i32::MIN..=-1 => exit_code.checked_neg(),
        _ => None,
    };
    ExitInfo {
        code: None,
        signal,
        reason: ExitReason::Exited,
    }
}

/// Forwards one command's events in order until its end, its timeout, a cancel or the
/// caller going away (the last three kill it).
async fn follow(
    mut events: Events,
    first: Item,
    tx: mpsc::Sender<ExecEvent>,
    timeout: Option<Duration>,
    cancelled: Arc<Notify>,
    killer: impl std::future::Future<Output = ()>,
) {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut next = Some(Ok(first));
    let mut exit = None;
    let stop = loop {
        let item = match next.take() {
            Some(item) => item,
            None => {
                let limit = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    item = events.next() => item,
                    _ = limit => break Some(ExitReason::TimedOut),
                    _ = cancelled.notified() => break Some(ExitReason::Cancelled),
                    _ = tx.closed() => break Some(ExitReason::Cancelled),
                }
            }
        };
        let event = match item {
            Ok(Item::Event(Event::Stdout(b))) => ExecEvent::Stdout(Bytes::from(b)),
            Ok(Item::Event(Event::Stderr(b))) => ExecEvent::Stderr(Bytes::from(b)),
            Ok(Item::Event(Event::End {
                exit_code, exited, ..
            })) => {
                exit = Some(exit_of(exit_code, exited));
                continue;
            }
            Ok(Item::Event(_)) => continue,
            Ok(Item::Done) => break None,
            Err(e) if e.code == "deadline_exceeded" => break Some(ExitReason::TimedOut),
            Err(e) => {
                tracing::warn!(code = %e.code, error = %e.message, "prime-intellect: a command's stream failed");
                break None;
            }
        };
        if tx.send(event).await.is_err() {
            break Some(ExitReason::Cancelled);
        }
    };
    let info = match stop {
        Some(reason) => {
            killer.await;
            ExitInfo {
                code: None,
                signal: Some(9),
                reason,
            }
        }
        None => exit.unwrap_or(ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::Exited,
        }),
    };
    let _ = tx.send(ExecEvent::Exit(info)).await;
}

impl Prime {
    /// A gateway call with the sandbox's token, renewed once when the gateway answers 401.
    async fn gateway_send(
        &self,
        id: &str,
        build: impl Fn(&GatewayAuth) -> RequestBuilder,
    ) -> Result<(Response, GatewayAuth), OpError> {
        let mut fresh = false;
        loop {
            let auth = self.gateway_auth(id, fresh).await?;
            match self.http.send(build(&auth).bearer_auth(&auth.token)).await {
                Ok(response) => return Ok((response, auth)),
                Err(f) if f.status == Some(StatusCode::UNAUTHORIZED) && !fresh => fresh = true,
                Err(f) => return Err(gateway_error(f)),
            }
        }
    }

    /// `CommandSession/Start`: the command's events, in order, as an [`ExecStream`].
    pub(super) async fn exec_stream(
        &self,
        id: &str,
        spec: ExecSpec,
    ) -> Result<ExecStream, OpError> {
        if spec.argv.first().is_none_or(|p| p.is_empty()) {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "argv must name a program",
            ));
        }
        let session = uuid_v4();
        let payload = proto::start_request(&spec.argv, &spec.env, spec.cwd.as_deref(), &session);
        let body = connect_rpc::envelope(&payload);
        let (response, auth) = self
            .gateway_send(id, |auth| {
                let url = format!("{}/{START}", auth.base());
                let request = self
                    .http
                    .request_plain(Method::POST, &url)
                    .header(http::header::CONTENT_TYPE, STREAM_TYPE)
                    .header("Connect-Protocol-Version", "1")
                    .body(body.clone());
                match spec.timeout {
                    Some(t) => request
                        .header("Connect-Timeout-Ms", t.as_millis().to_string())
                        .timeout(t + Duration::from_secs(10)),
                    None => request.timeout(NO_TIMEOUT),
                }
            })
            .await?;
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !content_type.starts_with(STREAM_TYPE) {
            return Err(OpError::new(
                OpErrorKind::Provider,
                format!(
                    "prime-intellect's gateway answered {content_type:?}, not a Connect stream"
                ),
            ));
        }
        let mut events = Events {
            response,
            decoder: connect_rpc::Decoder::default(),
            ended: false,
        };
        // A refusal (the sandbox not running, a bad cwd) is the stream's first and only
        // message: an error of the exec itself.
        let first = events.next().await.map_err(|e| e.op_error())?;
        let (tx, rx) = mpsc::channel(64);
        let cancelled = Arc::new(Notify::new());
        let killer = kill(self.http.clone(), auth, session);
        tokio::spawn(follow(
            events,
            first,
            tx,
            spec.timeout,
            cancelled.clone(),
            killer,
        ));
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || cancelled.notify_one());
        Ok(ExecStream { events: rx, cancel })
    }

    /// Runs a command to its end: its exit code and its stderr.
    pub(super) async fn run(
        &self,
        id: &str,
        argv: Vec<String>,
    ) -> Result<(Option<i32>, String), OpError> {
        let spec = ExecSpec {
            argv,
            timeout: Some(Duration::from_secs(60)),
            ..ExecSpec::default()
        };
        let mut stream = self.exec_stream(id, spec).await?;
        let mut stderr = Vec::new();
        while let Some(event) = stream.events.recv().await {
            match event {
                ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
                ExecEvent::Stdout(_) => {}
                ExecEvent::Exit(info) => {
                    return Ok((info.code, String::from_utf8_lossy(&stderr).into_owned()))
                }
            }
        }
        Ok((None, String::from_utf8_lossy(&stderr).into_owned()))
    }

    /// `GET /download?path=&sandbox_id=`: the file's bytes.
    pub(super) async fn download(&self, id: &str, path: &str) -> Result<Vec<u8>, OpError> {
        let (response, _) = self
            .gateway_send(id, |auth| {
                self.http
                    .request_plain(Method::GET, &format!("{}/download", auth.base()))
                    .query(&[("path", path), ("sandbox_id", id)])
            })
            .await?;
        self.http.file_bytes(response, path).await
    }

    /// `POST /upload?path=&sandbox_id=` with the bytes as the multipart `file`.
    pub(super) async fn upload(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), OpError> {
        let data = Bytes::from(data);
        let file_name = path.rsplit('/').next().unwrap_or("file").to_string();
        self.gateway_send(id, |auth| {
            let part = reqwest::multipart::Part::stream(data.clone()).file_name(file_name.clone());
            self.http
                .request_plain(Method::POST, &format!("{}/upload", auth.base()))
                .query(&[("path", path), ("sandbox_id", id)])
                .multipart(reqwest::multipart::Form::new().part("file", part))
        })
        .await?;
        Ok(())
    }
}
