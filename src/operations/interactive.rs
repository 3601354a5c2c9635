//! Interactive commands: a terminal session (`sandgate.action`, operation `pty`), a command
//! started with a stdin pipe (operation `exec`), and input sent to it while it runs
//! (operation `stdin`). Each is its own operation so that a policy can allow commands but
//! not a shell, or commands but not feeding them.

use super::authorize::{authorize, instance, op_failed};
use super::commands::{authorize_exec, ExecRequest};
use super::{Layer, OperationDetail, OpsContext, Principal};
use crate::error::Error;
use crate::providers::{InputMode, InteractiveStream};

/// Checks, authorizes and starts an interactive command: on a terminal as operation `pty`,
/// with a stdin pipe as `exec` (input is authorized per send, see [`authorize_input`]).
/// Policy sees the command as for an exec (`input.exec.argv`, `cwd`, `env_names`).
pub async fn start_interactive(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    request: ExecRequest,
    mode: InputMode,
) -> Result<InteractiveStream, Error> {
    let operation = match mode {
        InputMode::Terminal(_) => "pty",
        InputMode::Stdin => "exec",
    };
    let (located, adapter, spec) = authorize_exec(ctx, caller, id, operation, request).await?;
    let started = adapter
        .exec_interactive(instance(&located), spec, mode)
        .await
        .map_err(|e| op_failed(ctx, id, e))?;
    metrics::counter!("sandgate_sandbox_execs_total").increment(1);
    Ok(InteractiveStream {
        stream: started.stream.exit_on_cancel(),
        input: started.input,
    })
}

/// Authorizes sending input to a running command (operation `stdin`), `detail` naming it.
pub async fn authorize_input(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    detail: OperationDetail<'_>,
) -> Result<(), Error> {
    authorize(ctx, caller, id, Layer::Action, "stdin", detail, super::LIVE)
        .await
        .map(|_| ())
}
