//! Commands and files through a task's command router
//! (`modal.task_command_router.TaskCommandRouter`): its access (URL and JWT), starting a
//! command, its stdout and stderr as server streams, its stdin, and its exit.

use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use tokio::sync::{mpsc, Notify};
use tonic::Code;

use super::grpc::{GrpcFailure, Meta, Rpc};
use super::{op_error, proto, Modal, Router};
use crate::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason};
use crate::providers::hosted::tags::uuid_v4;
use crate::providers::{OpError, OpErrorKind};

/// A router token is renewed this long before it expires (as the SDK does).
const AUTH_MARGIN: Duration = Duration::from_secs(60);
/// A token without a readable `exp` is asked for again after this long.
const AUTH_DEFAULT: Duration = Duration::from_secs(300);
/// Stdin goes in pieces of this size.
const STDIN_CHUNK: usize = 512 * 1024;
/// A stdio stream that breaks is resumed from its offset this many times.
const STREAM_RETRIES: u32 = 3;
/// A router call other than a stream.
const ROUTER_DEADLINE: Duration = Duration::from_secs(60);
/// The longest a helper command (files, the CA) may run.
const HELPER_TIMEOUT: Duration = Duration::from_secs(120);

/// When a JWT expires (its `exp` claim), read without verifying it: only to renew in time.
fn jwt_expiry(jwt: &str) -> Option<Duration> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some(Duration::from_secs_f64((exp - now).max(0.0)))
}

fn not_running(id: &str) -> OpError {
    OpError::new(
        OpErrorKind::Conflict,
        format!("modal sandbox {id} is not running"),
    )
}

/// A running command: where it runs and its id.
struct Started {
    router: Router,
    exec_id: String,
    /// When `TaskExecStart` was sent: the router's timeout clock starts after it, so a
    /// command it killed at its timeout has always run `timeout` by this clock (a clock
    /// started on the answer runs behind by the round trip and calls some timeouts exits).
    sent: Instant,
}

impl Modal {
    /// The sandbox's command router, cached until a minute before its token expires.
    async fn router(&self, id: &str, fresh: bool) -> Result<Router, OpError> {
        let cached = self
            .routers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        let task_id = match cached {
            Some(r) if !fresh && Instant::now() < r.renew_at => return Ok(r),
            Some(r) => r.task_id,
            None => self.task_of(id).await?,
        };
        let request = proto::TaskGetCommandRouterAccessRequest {
            task_id: task_id.clone(),
        };
        let access: proto::TaskGetCommandRouterAccessResponse = self
            .call(proto::client::TASK_GET_COMMAND_ROUTER_ACCESS, request)
            .await
            .map_err(op_error)?;
        let meta = Meta::bearer(&access.jwt).map_err(|m| OpError::new(OpErrorKind::Provider, m))?;
        let rpc = Rpc::new(&access.url, &self.tls, meta)
            .map_err(|m| OpError::new(OpErrorKind::Provider, m))?;
        let left = jwt_expiry(&access.jwt).unwrap_or(AUTH_DEFAULT + AUTH_MARGIN);
        let router = Router {
            task_id,
            rpc,
            renew_at: Instant::now() + left.saturating_sub(AUTH_MARGIN),
        };
        self.routers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), router.clone());
        Ok(router)
    }

    pub(super) fn forget_router(&self, id: &str) {
        self.routers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// The running sandbox's task id (a short wait: it runs already).
    async fn task_of(&self, id: &str) -> Result<String, OpError> {
        let request = proto::SandboxGetTaskIdRequest {
            sandbox_id: id.to_string(),
            timeout: Some(10.0),
            wait_until_ready: false,
        };
        let answer: proto::SandboxGetTaskIdResponse = self
            .call(proto::client::SANDBOX_GET_TASK_ID, request)
            .await
            .map_err(op_error)?;
        if answer.task_result.is_some() {
            return Err(not_running(id));
        }
        answer
            .task_id
            .filter(|t| !t.is_empty())
            .ok_or_else(|| not_running(id))
    }

    /// A router call, its token renewed once when the router answers `UNAUTHENTICATED`.
    async fn routed<Q, R>(
        &self,
        id: &str,
        path: &'static str,
        request: impl Fn(&Router) -> Q,
    ) -> Result<(R, Router), OpError>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        let mut fresh = false;
        loop {
            let router = self.router(id, fresh).await?;
            match router
                .rpc
                .unary(path, request(&router), None, ROUTER_DEADLINE)
                .await
            {
                Ok(answer) => return Ok((answer, router)),
                Err(f) if f.code == Some(Code::Unauthenticated) && !fresh => fresh = true,
                Err(f) => return Err(op_error(f)),
            }
        }
    }

    /// `TaskExecStart`: the command runs.
    async fn start(&self, id: &str, spec: &ExecSpec) -> Result<Started, OpError> {
        if spec.argv.first().is_none_or(|p| p.is_empty()) {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "argv must name a program",
            ));
        }
        let exec_id = uuid_v4();
        let sent = Instant::now();
        let (_, router): (proto::TaskExecStartResponse, _) = self
            .routed(id, proto::router::TASK_EXEC_START, |router| {
                proto::TaskExecStartRequest {
                    task_id: router.task_id.clone(),
                    exec_id: exec_id.clone(),
                    command_args: spec.argv.clone(),
                    stdout_config: proto::StdoutConfig::Pipe as i32,
                    stderr_config: proto::StderrConfig::Pipe as i32,
                    timeout_secs: spec
                        .timeout
                        .map(|t| t.as_secs_f64().ceil().clamp(1.0, u32::MAX as f64) as u32),
                    workdir: spec.cwd.clone(),
                    // The environment inline, as the SDK sends it.
                    secret_sources: (!spec.env.is_empty())
                        .then(|| proto::SecretSource {
                            secret_id: String::new(),
                            env: Some(proto::StringMap {
                                contents: spec.env.clone().into_iter().collect(),
                            }),
                        })
                        .into_iter()
                        .collect(),
                    ..Default::default()
                }
            })
            .await?;
        Ok(Started {
            router,
            exec_id,
            sent,
        })
    }

    /// `TaskExecStdinWrite` of `data` in pieces, then end of file.
    async fn write_stdin(&self, started: &Started, data: Vec<u8>) -> Result<(), OpError> {
        let mut offset = 0u64;
        let mut pieces: Vec<&[u8]> = data.chunks(STDIN_CHUNK).collect();
        if pieces.is_empty() {
            pieces.push(&[]);
        }
        let last = pieces.len() - 1;
        for (i, piece) in pieces.into_iter().enumerate() {
            let request = proto::TaskExecStdinWriteRequest {
                task_id: started.router.task_id.clone(),
                exec_id: started.exec_id.clone(),
                offset,
                data: piece.to_vec(),
                eof: i == last,
            };
            let _: proto::TaskExecStdinWriteResponse = started
                .router
                .rpc
                .unary(
                    proto::router::TASK_EXEC_STDIN_WRITE,
                    request,
                    None,
                    ROUTER_DEADLINE,
                )
                .await
                .map_err(op_error)?;
            offset += piece.len() as u64;
        }
        Ok(())
    }

    /// The command as an [`ExecStream`]: stdout and stderr as they come (each in order),
    /// then its exit.
    pub(super) async fn exec_stream(
        &self,
        id: &str,
        spec: ExecSpec,
    ) -> Result<ExecStream, OpError> {
        let started = self.start(id, &spec).await?;
        let (tx, rx) = mpsc::channel(64);
        let cancelled = std::sync::Arc::new(Notify::new());
        tokio::spawn(follow(started, tx, spec.timeout, cancelled.clone()));
        // Modal's router cannot kill one command: a cancel stops the stream here; the
        // command runs on until it ends or its timeout.
        let cancel: std::sync::Arc<dyn Fn() + Send + Sync> =
            std::sync::Arc::new(move || cancelled.notify_one());
        Ok(ExecStream { events: rx, cancel })
    }

    /// Runs a helper command to its end with `stdin`: its exit code, stdout and stderr.
    async fn run(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<Vec<u8>>,
    ) -> Result<(Option<i32>, Vec<u8>, Vec<u8>), OpError> {
        let spec = ExecSpec {
            argv,
            timeout: Some(HELPER_TIMEOUT),
            ..ExecSpec::default()
        };
        let started = self.start(id, &spec).await?;
        if let Some(data) = stdin {
            self.write_stdin(&started, data).await?;
        }
        let read = |fd| read_all(&started, fd);
        let (out, err) = tokio::try_join!(
            read(proto::StdioFileDescriptor::Stdout),
            read(proto::StdioFileDescriptor::Stderr)
        )
        .map_err(op_error)?;
        let exit = wait(&started).await.map_err(op_error)?;
        Ok((exit.code, out, err))
    }

    /// [`Modal::run`] that must exit 0: its stdout.
    pub(super) async fn run_checked(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Vec<u8>,
    ) -> Result<Vec<u8>, OpError> {
        let program = argv.first().cloned().unwrap_or_default();
        let (code, out, err) = self.run(id, argv, Some(stdin)).await?;
        if code == Some(0) {
            return Ok(out);
        }
        Err(file_error(&program, code, &err))
    }

    /// A file's bytes (`cat`).
    pub(super) async fn download(&self, id: &str, path: &str) -> Result<Vec<u8>, OpError> {
        let argv = ["cat", "--", path].map(String::from).to_vec();
        self.run_checked(id, argv, Vec::new()).await
    }

    /// Writes a file, its parent directories made (`mkdir -p` + `cat >`, bytes on stdin).
    pub(super) async fn upload(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), OpError> {
        let script = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;
        let argv = ["sh", "-c", script, "sh", path].map(String::from).to_vec();
        self.run_checked(id, argv, data).await.map(|_| ())
    }
}

/// A helper command's failure: a missing file is `not_found`, a directory `invalid`.
fn file_error(program: &str, code: Option<i32>, stderr: &[u8]) -> OpError {
    let said = String::from_utf8_lossy(stderr);
    let said = said.trim().chars().take(300).collect::<String>();
    let kind = if said.contains("No such file") {
        OpErrorKind::NotFound
    } else if said.contains("Is a directory") || said.contains("Not a directory") {
        OpErrorKind::Invalid
    } else {
        OpErrorKind::Provider
    };
    OpError::new(
        kind,
        format!("{program} in the modal sandbox exited with {code:?}: {said}"),
    )
}

/// One stdio stream from `offset`, resumed where it broke.
async fn read_stream<F, Fut>(
    started: &Started,
    fd: proto::StdioFileDescriptor,
    mut sink: F,
) -> Result<(), GrpcFailure>
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut offset = 0u64;
    let mut retries = 0;
    loop {
        let request = proto::TaskExecStdioReadRequest {
            task_id: started.router.task_id.clone(),
            exec_id: started.exec_id.clone(),
            offset,
            file_descriptor: fd as i32,
        };
        let mut stream = started
            .router
            .rpc
            .server_stream::<_, proto::TaskExecStdioReadResponse>(
                proto::router::TASK_EXEC_STDIO_READ,
                request,
                None,
            )
            .await?;
        let broke = loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    offset += chunk.data.len() as u64;
                    if !chunk.data.is_empty() && !sink(chunk.data).await {
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(status) => break status,
            }
        };
        retries += 1;
        if retries > STREAM_RETRIES {
            return Err(GrpcFailure {
                code: Some(broke.code()),
                message: format!("modal's output stream broke: {}", broke.message()),
                retry_after: None,
                sent: true,
            });
        }
    }
}

async fn read_all(
    started: &Started,
    fd: proto::StdioFileDescriptor,
) -> Result<Vec<u8>, GrpcFailure> {
    let all = std::sync::Mutex::new(Vec::new());
    read_stream(started, fd, |data| {
        all.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(&data);
        std::future::ready(true)
    })
    .await?;
    Ok(all.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// `TaskExecWait`: how the command ended.
async fn wait(started: &Started) -> Result<ExitInfo, GrpcFailure> {
    let request = proto::TaskExecWaitRequest {
        task_id: started.router.task_id.clone(),
        exec_id: started.exec_id.clone(),
    };
    // The wait lasts as long as the command: no deadline of its own.
    let answer: proto::TaskExecWaitResponse = started
        .router
        .rpc
        .unary(
            proto::router::TASK_EXEC_WAIT,
            request,
            None,
            Duration::from_secs(24 * 3600),
        )
        .await?;
    Ok(match answer.exit_status {
        Some(proto::ExitStatus::Code(code)) => ExitInfo {
            code: Some(code),
            signal: None,
            reason: ExitReason::Exited,
        },
        Some(proto::ExitStatus::Signal(signal)) => ExitInfo {
            code: None,
            signal: Some(signal),
            reason: ExitReason::Exited,
        },
        None => ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::Exited,
        },
    })
}

/// Forwards a command's output until it ends, then its exit; a cancel, the caller going
/// away or the timeout (plus a grace for the router's own) end the stream early.
async fn follow(
    started: Started,
    tx: mpsc::Sender<ExecEvent>,
    timeout: Option<Duration>,
    cancelled: std::sync::Arc<Notify>,
) {
    let output = async {
        // A full channel holds the reader back (nothing is dropped); a closed one stops it.
        let out = read_stream(&started, proto::StdioFileDescriptor::Stdout, |data| {
            let tx = tx.clone();
            async move { tx.send(ExecEvent::Stdout(Bytes::from(data))).await.is_ok() }
        });
        let err = read_stream(&started, proto::StdioFileDescriptor::Stderr, |data| {
            let tx = tx.clone();
            async move { tx.send(ExecEvent::Stderr(Bytes::from(data))).await.is_ok() }
        });
        let (out, err) = tokio::join!(out, err);
        if let Err(e) = out.and(err) {
            tracing::warn!(error = %e.message, "modal: a command's output stream failed");
        }
        wait(&started).await
    };
    let limit = async {
        match timeout {
            Some(t) => tokio::time::sleep(t + Duration::from_secs(10)).await,
            None => std::future::pending().await,
        }
    };
    let info = tokio::select! {
        exit = output => match exit {
            Ok(mut info) => {
                // The router ends a command at its timeout with a signal.
                if info.signal.is_some() && timeout.is_some_and(|t| started.sent.elapsed() >= t) {
                    info.reason = ExitReason::TimedOut;
                }
                info
            }
            Err(e) => {
                tracing::warn!(error = %e.message, "modal: a command's exit is unknown");
                ExitInfo { code: None, signal: None, reason: ExitReason::Exited }
            }
        },
        _ = limit => ExitInfo { code: None, signal: None, reason: ExitReason::TimedOut },
        _ = cancelled.notified() => ExitInfo { code: None, signal: None, reason: ExitReason::Cancelled },
        _ = tx.closed() => return,
    };
    let _ = tx.send(ExecEvent::Exit(info)).await;
}
