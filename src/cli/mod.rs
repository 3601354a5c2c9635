//! Client subcommands of the `sandgate` binary: `sandbox ...`, `pools`, `credential ...` and
//! `delegation ...` talk to a running gateway's API (found as [`client`] describes) and print
//! by one output contract ([`output`]: tables on a terminal, JSON otherwise, `-o`, `-q`,
//! errors on stderr, documented exit codes); `route explain` answers on the measured context
//! of the configured store, or of a running gateway with `--url`; `provider check` calls a
//! hosted account once.

pub mod client;
pub mod completions;
pub mod config_check;
pub mod credential;
pub mod delegation;
mod exec;
mod explain;
mod files;
pub mod logs;
pub mod output;
mod pools;
mod provider;
pub mod replay;
mod sandbox;
mod shapes;
mod shell;
pub mod suggest;
mod term;
mod wait;
mod watch;
mod why;
mod ws;

use std::future::Future;
use std::path::PathBuf;

use serde_json::Value;

pub(crate) use client::Api;
pub use client::GatewayArgs;
pub use explain::{route, RouteCommand};
pub use output::OutputArgs;
pub use pools::pools;
pub use provider::{provider, ProviderCommand};
pub use sandbox::{FilesCommand, SandboxCommand};

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("request to {url} failed: {message}")]
    Http { url: String, message: String },
    #[error("cannot reach the gateway at {base}: {message}; is `sandgate serve` running? set SANDGATE_URL or pass --url (or --config with its [api] listen)")]
    Unreachable { base: String, message: String },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

impl CliError {
    /// The stable code printed as `error: <code>: ...`.
    pub fn code(&self) -> &'static str {
        match self {
            CliError::Usage(_) => "usage",
            CliError::Read { .. } => "unreadable_input",
            CliError::Json { .. } => "invalid_json",
            CliError::Http { .. } => "request_failed",
            CliError::Unreachable { .. } => "unreachable",
            CliError::Config(_) => "invalid_config",
        }
    }

    /// Its exit code: 2 for what the user must fix in the command or its input, 1 when the
    /// gateway could not be talked to.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Http { .. } | CliError::Unreachable { .. } => output::FAILED,
            _ => output::USAGE,
        }
    }

    /// Printed on stderr in the contract's shape and turned into its exit code.
    pub fn report(&self, format: Option<output::Format>) -> i32 {
        let message = self.to_string();
        eprint!(
            "{}",
            output::error_line(format, self.code(), &message, &Value::Null)
        );
        self.exit_code()
    }
}

/// Runs a client command against the gateway `gateway` names, on a current-thread runtime;
/// any error is printed by the contract and becomes the exit code.
pub(crate) fn run_client<F, Fut>(gateway: &GatewayArgs, out: &OutputArgs, command: F) -> i32
where
    F: FnOnce(Api) -> Fut,
    Fut: Future<Output = Result<i32, CliError>>,
{
    let result = gateway.connect().and_then(|api| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::Usage(format!("cannot start the async runtime: {e}")))
            .and_then(|runtime| runtime.block_on(command(api)))
    });
    result.unwrap_or_else(|e| e.report(out.output))
}

/// `sandgate sandbox ...`: the exit code of the output contract ([`output`]).
pub fn sandbox(cmd: SandboxCommand, gateway: &GatewayArgs, out: &OutputArgs) -> i32 {
    run_client(gateway, out, |api| async move {
        sandbox::run(&api, out, cmd).await
    })
}

fn read_json(path: &PathBuf) -> Result<Value, CliError> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|source| {
            CliError::Read {
                path: path.clone(),
                source,
            }
        })?;
        s
    } else {
        std::fs::read_to_string(path).map_err(|source| CliError::Read {
            path: path.clone(),
            source,
        })?
    };
    serde_json::from_str(&text).map_err(|e| CliError::Json {
        path: path.clone(),
        message: e.to_string(),
    })
}

/// Percent-encodes a query value (everything but unreserved characters).
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
