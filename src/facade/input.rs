//! envd's input calls on a running command (`process.Process`): `SendInput` (stdin bytes or
//! terminal keystrokes, operation `stdin`), `CloseStdin` (operation `stdin`) and `Update` (a
//! terminal's new size, operation `pty`), and what `Start` asks for (`pty`, `stdin`).
//! Policy sees the command as `input.exec.pid`.

use base64::Engine as _;
use serde_json::{json, Value};

use super::call::EnvdCall;
use super::errors::rpc_error;
use super::process::integer;
use super::FacadeState;
use crate::e2b::connect::RpcError;
use crate::operations::authorize::authorize;
use crate::operations::{Layer, OperationDetail};
use crate::providers::ops::{ExecInput, WinSize};
use crate::providers::InputMode;

/// Largest terminal dimension accepted.
const MAX_DIMENSION: u64 = 1000;

/// How a `StartRequest` wants its command's input: on a terminal (`pty.size`), with a
/// stdin pipe (`stdin: true`), or neither.
pub(super) fn input_mode(request: &Value) -> Result<Option<InputMode>, RpcError> {
    if !request["pty"].is_null() {
        return size(&request["pty"]["size"]).map(|s| Some(InputMode::Terminal(s)));
    }
    Ok((request["stdin"] == Value::Bool(true)).then_some(InputMode::Stdin))
}

/// A `PTY.Size` (`{rows, cols}`), each 1 to [`MAX_DIMENSION`].
fn size(value: &Value) -> Result<WinSize, RpcError> {
    let dim = |key: &str| {
        integer(&value[key])
            .filter(|n| (1..=MAX_DIMENSION).contains(n))
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| {
                RpcError::new(
                    "invalid_argument",
                    format!("pty.size.{key} must be 1 to {MAX_DIMENSION}"),
                )
            })
    };
    Ok(WinSize {
        rows: dim("rows")?,
        cols: dim("cols")?,
    })
}

/// Authorizes `operation` on the selected command; its input channel.
async fn selected_input(
    state: &FacadeState,
    call: &EnvdCall,
    body: &Value,
    operation: &str,
) -> Result<tokio::sync::mpsc::Sender<ExecInput>, RpcError> {
    let selected = state.processes.select(&call.row.id, &body["process"]);
    let pid_hint = match &selected {
        Ok((pid, _)) => *pid,
        Err(_) => integer(&body["process"]["pid"])
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
    };
    let detail = OperationDetail::ExecPid(pid_hint);
    let states = crate::operations::LIVE;
    authorize(
        &state.ops,
        &call.principal,
        &call.row.id,
        Layer::Action,
        operation,
        detail,
        states,
    )
    .await
    .map_err(|e| rpc_error(&e))?;
    let (pid, running) = selected?;
    running.input.clone().ok_or_else(|| {
        RpcError::new(
            "failed_precondition",
            format!("process {pid} was started without stdin or a pty"),
        )
    })
}

async fn deliver(
    input: &tokio::sync::mpsc::Sender<ExecInput>,
    item: ExecInput,
) -> Result<Value, RpcError> {
    input
        .send(item)
        .await
        .map(|()| json!({}))
        .map_err(|_| RpcError::new("not_found", "the process has ended"))
}

/// `process.Process/SendInput`: `input.stdin` or `input.pty`, base64.
pub(super) async fn send(
    state: &FacadeState,
    call: &EnvdCall,
    body: &Value,
) -> Result<Value, RpcError> {
    let input = &body["input"];
    let encoded = input["stdin"].as_str().or_else(|| input["pty"].as_str());
    let Some(encoded) = encoded else {
        return Err(RpcError::new(
            "invalid_argument",
            "input.stdin or input.pty is required",
        ));
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| RpcError::new("invalid_argument", "input is not base64"))?;
    let sender = selected_input(state, call, body, "stdin").await?;
    deliver(&sender, ExecInput::Data(bytes.into())).await
}

/// `process.Process/CloseStdin`: end of input.
pub(super) async fn close(
    state: &FacadeState,
    call: &EnvdCall,
    body: &Value,
) -> Result<Value, RpcError> {
    let sender = selected_input(state, call, body, "stdin").await?;
    deliver(&sender, ExecInput::Eof).await
}

/// `process.Process/Update`: a terminal's new size.
pub(super) async fn update(
    state: &FacadeState,
    call: &EnvdCall,
    body: &Value,
) -> Result<Value, RpcError> {
    let new_size = size(&body["pty"]["size"])?;
    let sender = selected_input(state, call, body, "pty").await?;
    deliver(&sender, ExecInput::Resize(new_size)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_requests_name_their_input() {
        let pty = json!({"pty": {"size": {"rows": 24, "cols": "80"}}});
        assert_eq!(
            input_mode(&pty).unwrap(),
            Some(InputMode::Terminal(WinSize { rows: 24, cols: 80 }))
        );
        assert_eq!(
            input_mode(&json!({"stdin": true})).unwrap(),
            Some(InputMode::Stdin)
        );
        assert_eq!(input_mode(&json!({"stdin": false})).unwrap(), None);
        assert!(input_mode(&json!({"pty": {"size": {"rows": 0, "cols": 80}}})).is_err());
    }
}
