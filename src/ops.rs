//! Operations on a running sandbox, provider-neutral: what the API, the CLI and every
//! adapter share for exec, files, lifecycle and snapshots.
//!
//! Contract:
//! - An exec streams [`ExecEvent`]s in order: output chunks (exact order within stdout and
//!   within stderr), then exactly one `Exit`, then the stream ends. Dropping the stream
//!   before `Exit`, or calling its canceller, kills the command's whole process tree.
//! - Every failure is an [`OpError`] with a stable kind the API maps to one status and
//!   code; its message never holds a secret (file contents, environment values).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

pub use crate::localbox::{
    EntryKind, ExecEvent, ExecInput, ExitInfo, ExitReason, FsEventKind, Usage, WatchEvent, WinSize,
};

/// A portable user name (POSIX's, lower case): what a pool may declare and a caller ask for.
pub fn user_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// One command to run.
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    /// Added to the sandbox's environment (may not redefine the proxy or CA variables).
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox (default its home).
    pub cwd: Option<String>,
    /// The command's whole process tree is killed after this long.
    pub timeout: Option<Duration>,
    /// The user it runs as, by name, among those the sandbox's pool declares; `None` is the
    /// pool's default user. Checked before the command starts
    /// ([`crate::providers::Provider::exec_user`]): never silently ignored.
    pub user: Option<String>,
}

/// A running command's output and its cancel switch.
pub struct ExecStream {
    pub events: mpsc::Receiver<ExecEvent>,
    pub cancel: Arc<dyn Fn() + Send + Sync>,
}

impl ExecStream {
    /// This stream, held to the contract's end once cancelled: exactly one `Exit`, of reason
    /// `Cancelled`. Adapters whose canceller stops reading the provider's stream (E2B,
    /// Blaxel, Vercel, Runloop) would otherwise end it with no `Exit` at all, and a client
    /// would not know the command ended. Dropping the returned stream drops the adapter's at
    /// once, so that still kills the command.
    pub fn exit_on_cancel(self) -> ExecStream {
        let ExecStream { mut events, cancel } = self;
        let cancelled = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel(64);
        let seen = cancelled.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = events.recv() => event,
                    _ = tx.closed() => return,
                };
                let was_cancelled = seen.load(Ordering::SeqCst);
                match event {
                    Some(ExecEvent::Exit(mut exit)) => {
                        if was_cancelled && exit.reason == ExitReason::Exited {
                            exit.reason = ExitReason::Cancelled;
                        }
                        let _ = tx.send(ExecEvent::Exit(exit)).await;
                        return;
                    }
                    Some(event) => {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                    None => {
                        if was_cancelled {
                            let exit = ExitInfo {
                                code: None,
                                signal: None,
                                reason: ExitReason::Cancelled,
                            };
                            let _ = tx.send(ExecEvent::Exit(exit)).await;
                        }
                        return;
                    }
                }
            }
        });
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            cancelled.store(true, Ordering::SeqCst);
            cancel();
        });
        ExecStream { events: rx, cancel }
    }
}

/// How an interactive command takes its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputMode {
    /// On a pseudo-terminal of this size (operation `pty`).
    Terminal(WinSize),
    /// Through a pipe on its standard input (an exec with `stdin`).
    Stdin,
}

impl InputMode {
    /// The operation an adapter that cannot do this names in its `unsupported` answer.
    pub fn operation(self) -> &'static str {
        match self {
            InputMode::Terminal(_) => "pty",
            InputMode::Stdin => "exec.stdin",
        }
    }
}

/// A running interactive command: its output, exactly as an [`ExecStream`], and its input.
/// Dropping `input` stops input only; dropping the stream still kills the command.
pub struct InteractiveStream {
    pub stream: ExecStream,
    pub input: mpsc::Sender<ExecInput>,
}

/// A running watch of a sandbox directory (operation `watch`): its events, bounded (a
/// reader that falls behind gets [`WatchEvent::Overflow`] in place of what was dropped),
/// until the watch ends (`None`: the sandbox stopped or was deleted, or the directory was
/// removed). Dropping it ends the watch.
#[derive(Debug)]
pub struct WatchStream {
    pub events: mpsc::Receiver<WatchEvent>,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream").finish_non_exhaustive()
    }
}

/// One directory entry (`GET /v1/sandboxes/{id}/files` lists these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SandboxEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[schema(value_type = String)]
    pub kind: &'static str,
    pub size: u64,
    pub mode: u32,
    pub modified_unix: i64,
}

/// A lifecycle transition of a placed sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Stop,
    Start,
    Pause,
    Resume,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Stop => "stop",
            Lifecycle::Start => "start",
            Lifecycle::Pause => "pause",
            Lifecycle::Resume => "resume",
        }
    }

    /// The state a sandbox is in after this transition.
    pub fn resulting_state(self) -> &'static str {
        match self {
            Lifecycle::Stop => "stopped",
            Lifecycle::Start | Lifecycle::Resume => "running",
            Lifecycle::Pause => "paused",
        }
    }

    /// The states this transition starts from.
    pub fn from_states(self) -> &'static [&'static str] {
        match self {
            Lifecycle::Stop => &["running", "paused"],
            Lifecycle::Start => &["stopped"],
            Lifecycle::Pause => &["running"],
            Lifecycle::Resume => &["paused"],
        }
    }
}

/// A snapshot an adapter took.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    pub id: String,
    pub size_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpErrorKind {
    /// The instance, the file or the snapshot does not exist.
    NotFound,
    /// The request itself is wrong (bad path, empty argv, reserved variable).
    Invalid,
    /// The sandbox is not in a state that allows the operation (paused, stopped).
    Conflict,
    /// The provider does not offer this operation.
    Unsupported,
    /// The provider failed.
    Provider,
    /// The provider did not answer within the adapter's timeout (whether it applied the
    /// operation is unknown).
    TimedOut,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct OpError {
    pub kind: OpErrorKind,
    pub message: String,
}

impl OpError {
    pub fn new(kind: OpErrorKind, message: impl Into<String>) -> OpError {
        OpError {
            kind,
            message: message.into(),
        }
    }

    pub fn unsupported(provider: &str, operation: &str) -> OpError {
        OpError::new(
            OpErrorKind::Unsupported,
            format!("provider kind {provider:?} does not support {operation}"),
        )
    }

    /// The stable error code the API answers with.
    pub fn code(&self) -> &'static str {
        match self.kind {
            OpErrorKind::NotFound => "not_found",
            OpErrorKind::Invalid => "invalid_request",
            OpErrorKind::Conflict => "sandbox_state",
            OpErrorKind::Unsupported => "unsupported",
            OpErrorKind::Provider => "provider_error",
            OpErrorKind::TimedOut => "upstream_timeout",
        }
    }
}

impl From<crate::localbox::LocalboxError> for OpError {
    fn from(e: crate::localbox::LocalboxError) -> OpError {
        use crate::localbox::LocalboxError as L;
        let kind = match &e {
            L::NotFound(_) => OpErrorKind::NotFound,
            L::File { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                OpErrorKind::NotFound
            }
            L::File { source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::AlreadyExists
                        | std::io::ErrorKind::DirectoryNotEmpty
                        | std::io::ErrorKind::IsADirectory
                        | std::io::ErrorKind::NotADirectory
                        | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                OpErrorKind::Invalid
            }
            L::Invalid(_) | L::InvalidPath { .. } | L::InvalidId(_) => OpErrorKind::Invalid,
            L::State { .. } | L::AlreadyExists(_) => OpErrorKind::Conflict,
            L::Unsupported(_) | L::Privileges { .. } | L::MissingTool(_) => {
                OpErrorKind::Unsupported
            }
            L::File { .. } | L::Setup { .. } => OpErrorKind::Provider,
        };
        OpError::new(kind, e.to_string())
    }
}

impl From<crate::localbox::FileEntry> for SandboxEntry {
    fn from(e: crate::localbox::FileEntry) -> SandboxEntry {
        SandboxEntry {
            name: e.name,
            kind: match e.kind {
                EntryKind::File => "file",
                EntryKind::Dir => "dir",
                EntryKind::Symlink => "symlink",
                EntryKind::Other => "other",
            },
            size: e.size,
            mode: e.mode,
            modified_unix: e.modified_unix,
        }
    }
}
