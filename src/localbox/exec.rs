//! Streaming execution of one command inside a sandbox.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;
use tokio::sync::{mpsc, watch};

use super::cgroup;
use super::pty::{self, ExecInput, Master, Sink};

/// One output stream of a command: a pipe, or the master side of its terminal.
type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// One event of an exec's output stream. Events arrive in order: any number of
/// `Stdout`/`Stderr` chunks, then exactly one `Exit`, then the stream ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(ExitInfo),
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, when the command exited normally.
    pub code: Option<i32>,
    /// The signal that ended the command, when it was killed.
    pub signal: Option<i32>,
    pub reason: ExitReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// The command ended by itself (or was killed from inside the sandbox, or by a
    /// sandbox stop/delete).
    Exited,
    /// The request's timeout elapsed; the process tree was killed.
    TimedOut,
    /// [`ExecHandle::cancel`] was called; the process tree was killed.
    Cancelled,
}

/// A running exec. Read events with [`ExecHandle::next`]. Dropping the handle before the
/// `Exit` event (or calling [`ExecHandle::cancel`]) kills the exec's whole process tree.
#[derive(Debug)]
pub struct ExecHandle {
    events: mpsc::Receiver<ExecEvent>,
    cancel: watch::Sender<bool>,
    pid: u32,
    /// Input of a command started with a terminal or a stdin pipe.
    input: Option<mpsc::Sender<ExecInput>>,
}

impl ExecHandle {
    /// The next event; `None` after the `Exit` event.
    pub async fn next(&mut self) -> Option<ExecEvent> {
        self.events.recv().await
    }

    /// Kills the exec's process tree. The stream still ends with an `Exit` event whose
    /// reason is [`ExitReason::Cancelled`]. If the sandbox is paused the kill takes
    /// effect when it is resumed (or stopped).
    pub fn cancel(&self) {
        let _ = self.cancel.send(true);
    }

    /// Host process id of the command (0 when it could not be started).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The input of a command started with a terminal or with `stdin` (once; `None` for a
    /// plain exec). Dropping the sender ends nothing: it only stops input.
    pub fn take_input(&mut self) -> Option<mpsc::Sender<ExecInput>> {
        self.input.take()
    }

    /// Gives up the stream: the receiver yields the events; dropping it before the
    /// `Exit` event kills the process tree just as dropping the handle does.
    pub fn into_parts(self) -> (mpsc::Receiver<ExecEvent>, ExecCanceller) {
        (self.events, ExecCanceller(self.cancel))
    }

    /// Reads the whole stream into one [`ExecOutput`].
    pub async fn collect(mut self) -> ExecOutput {
        let mut out = ExecOutput::default();
        while let Some(event) = self.next().await {
            match event {
                ExecEvent::Stdout(b) => out.stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => out.stderr.extend_from_slice(&b),
                ExecEvent::Exit(exit) => out.exit = Some(exit),
            }
        }
        out
    }
}

/// The cancel half of an [`ExecHandle`] split by [`ExecHandle::into_parts`]. Dropping it
/// does not cancel; dropping the receiver does.
#[derive(Debug)]
pub struct ExecCanceller(watch::Sender<bool>);

impl ExecCanceller {
    pub fn cancel(&self) {
        let _ = self.0.send(true);
    }
}

/// Collected output of an exec.
#[derive(Debug, Default, Clone)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// `None` only if the driver vanished without reporting (never in practice).
    pub exit: Option<ExitInfo>,
}

impl ExecOutput {
    pub fn code(&self) -> Option<i32> {
        self.exit.as_ref().and_then(|e| e.code)
    }
}

/// How to kill an exec's tree: its freezer group, else its process group.
pub(crate) struct Killer {
    pub freezer: Option<PathBuf>,
    pub pgid: u32,
    /// The command leads a session (it has a terminal): its shell's jobs run in process
    /// groups of their own, so the whole session is killed too.
    pub session: bool,
}

impl Killer {
    async fn kill(&self) {
        if let Some(dir) = &self.freezer {
            if let Err(e) = cgroup::kill_group(dir).await {
                tracing::warn!(error = %e, "localbox: killing an exec's cgroup failed");
            }
        }
        if self.session {
            pty::kill_session(self.pgid);
        }
        if let Ok(pgid) = libc::pid_t::try_from(self.pgid) {
            if pgid > 1 {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
        }
    }

    fn cleanup(&self) {
        if let Some(dir) = &self.freezer {
            // Fails (and stays for stop/delete) while background processes remain.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Starts the driver of a spawned child; returns the handle given to the caller. With a
/// terminal's `master`, the output is the terminal's (as `Stdout`) and input goes to it;
/// otherwise a piped stdin, if any, takes the input.
pub(crate) fn drive(
    mut child: Child,
    killer: Killer,
    timeout: Option<Duration>,
    master: Option<Master>,
) -> std::io::Result<ExecHandle> {
    let pid = child.id().unwrap_or(0);
    let boxed = |r: Reader| Some(r);
    let (stdout, stderr, sink) = match master {
        Some(master) => (
            boxed(Box::new(master.clone())),
            None,
            Some(Sink::Terminal(master)),
        ),
        None => (
            child.stdout.take().and_then(|r| boxed(Box::new(r))),
            child.stderr.take().and_then(|r| boxed(Box::new(r))),
            child.stdin.take().map(|w| Sink::Pipe(Some(w))),
        ),
    };
    let input = sink.map(|sink| {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(pty::feed(sink, killer.pgid, rx));
        tx
    });
    let (tx, rx) = mpsc::channel(64);
    let (cancel_tx, cancel_rx) = watch::channel(false);
    tokio::spawn(run(child, stdout, stderr, killer, timeout, tx, cancel_rx));
    Ok(ExecHandle {
        events: rx,
        cancel: cancel_tx,
        pid,
        input,
    })
}

/// The stream of a command that could not be started (not found, not executable): its
/// message on stderr and the shell's exit code for it, as a shell inside the sandbox
/// would answer.
pub(crate) fn failed(code: i32, message: String) -> ExecHandle {
    let (tx, rx) = mpsc::channel(2);
    let _ = tx.try_send(ExecEvent::Stderr(Bytes::from(message)));
    let _ = tx.try_send(ExecEvent::Exit(ExitInfo {
        code: Some(code),
        signal: None,
        reason: ExitReason::Exited,
    }));
    let (cancel, _) = watch::channel(false);
    ExecHandle {
        events: rx,
        cancel,
        pid: 0,
        input: None,
    }
}

/// After the command exits, how long to wait for its pipes to reach EOF (background
/// processes may hold them open).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

async fn run(
    mut child: Child,
    mut stdout: Option<Reader>,
    mut stderr: Option<Reader>,
    killer: Killer,
    timeout: Option<Duration>,
    tx: mpsc::Sender<ExecEvent>,
    mut cancel: watch::Receiver<bool>,
) {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut reason = ExitReason::Exited;
    let mut status = None;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut cancel_open = true;
    let mut out_buf = vec![0u8; 16 * 1024];
    let mut err_buf = vec![0u8; 16 * 1024];
    loop {
        if status.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        tokio::select! {
            biased;
            changed = cancel.changed(), if cancel_open && reason == ExitReason::Exited && status.is_none() => {
                match changed {
                    Ok(()) if *cancel.borrow() => {
                        reason = ExitReason::Cancelled;
                        killer.kill().await;
                    }
                    Ok(()) => {}
                    // Only the canceller is gone; the receiver decides from now on.
                    Err(_) => cancel_open = false,
                }
            }
            // The receiver was dropped: nobody listens any more.
            _ = tx.closed(), if reason == ExitReason::Exited && status.is_none() => {
                reason = ExitReason::Cancelled;
                killer.kill().await;
            }
            _ = sleep_until(deadline), if reason == ExitReason::Exited && status.is_none() => {
                reason = ExitReason::TimedOut;
                killer.kill().await;
            }
            _ = sleep_until(drain_until), if drain_until.is_some() => {
                stdout = None;
                stderr = None;
            }
            read = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => match read {
                Some(n) => {
                    let chunk = Bytes::copy_from_slice(&out_buf[..n]);
                    if tx.send(ExecEvent::Stdout(chunk)).await.is_err() && status.is_none() && reason == ExitReason::Exited {
                        reason = ExitReason::Cancelled;
                        killer.kill().await;
                    }
                }
                None => stdout = None,
            },
            read = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => match read {
                Some(n) => {
                    let chunk = Bytes::copy_from_slice(&err_buf[..n]);
                    if tx.send(ExecEvent::Stderr(chunk)).await.is_err() && status.is_none() && reason == ExitReason::Exited {
                        reason = ExitReason::Cancelled;
                        killer.kill().await;
                    }
                }
                None => stderr = None,
            },
            waited = child.wait(), if status.is_none() => {
                status = Some(waited);
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
        }
    }
    killer.cleanup();
    let exit = match status {
        Some(Ok(status)) => {
            use std::os::unix::process::ExitStatusExt;
            ExitInfo {
                code: status.code(),
                signal: status.signal(),
                reason,
            }
        }
        _ => ExitInfo {
            code: None,
            signal: None,
            reason,
        },
    };
    let _ = tx.send(ExecEvent::Exit(exit)).await;
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn read_some<R: AsyncReadExt + Unpin>(pipe: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    let pipe = pipe.as_mut()?;
    match pipe.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}
