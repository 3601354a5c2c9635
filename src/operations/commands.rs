//! Commands: an exec request checked, authorized (`sandgate.action`, `exec`) and started.
//! The front end streams the result in its own shape (NDJSON for `/v1`, Connect frames for
//! the E2B facade).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::authorize::{authorize, instance, invalid, op_failed};
use super::{Layer, OperationDetail, OpsContext, Principal};
use crate::create::Located;
use crate::error::Error;
use crate::providers::{ExecSpec, ExecStream, Provider};

/// Longest exec timeout a caller may ask for.
const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Most arguments, and most environment variables, an exec may carry.
const MAX_EXEC_ENTRIES: usize = 4096;
/// Longest environment variable name, in bytes.
const MAX_ENV_NAME_BYTES: usize = 256;

/// A command to run, as any front end asks for it (field names are the `/v1` body's, and
/// errors name them).
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    /// The program and its arguments (no shell).
    pub argv: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox (default its home).
    pub cwd: Option<String>,
    /// Kill the command's process tree after this many milliseconds.
    pub timeout_ms: Option<u64>,
    /// Run as this user, one the sandbox's pool declares (default: the pool's default user).
    pub user: Option<String>,
}

/// Everything about an exec request the types do not say, checked before policy sees it:
/// a program, bounded lists, no NUL in any argument, value or the working directory (the
/// kernel cannot pass one), environment names of `[A-Za-z_][A-Za-z0-9_]*`, a timeout of 1 ms
/// to 24 h. Messages never quote a value (values may hold secrets).
pub fn check_exec(request: &ExecRequest) -> Result<(), Error> {
    check_argv(&request.argv)?;
    check_env(&request.env)?;
    if let Some(cwd) = &request.cwd {
        super::files::check_path("cwd", cwd)?;
    }
    let timeout = request.timeout_ms.map(Duration::from_millis);
    if timeout.is_some_and(|t| t.is_zero() || t > MAX_EXEC_TIMEOUT) {
        return Err(invalid(
            "timeout_ms",
            "`timeout_ms` must be between 1 and 86400000",
        ));
    }
    if request
        .user
        .as_deref()
        .is_some_and(|u| !crate::ops::user_name(u))
    {
        return Err(invalid(
            "user",
            "`user` must be a user name: 1 to 32 of a-z, 0-9, '_' and '-', starting with a \
             letter or '_'",
        ));
    }
    Ok(())
}

/// A program first, at most [`MAX_EXEC_ENTRIES`] arguments, none with a NUL.
fn check_argv(argv: &[String]) -> Result<(), Error> {
    if argv.is_empty() {
        return Err(invalid("argv", "`argv` must name a program"));
    }
    if argv.len() > MAX_EXEC_ENTRIES {
        return Err(invalid(
            "argv",
            format!("`argv` may have at most {MAX_EXEC_ENTRIES} entries"),
        ));
    }
    if argv[0].is_empty() {
        return Err(invalid("argv[0]", "`argv[0]` must name a program"));
    }
    if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
        return Err(invalid(
            &format!("argv[{i}]"),
            format!("`argv[{i}]` contains a NUL character"),
        ));
    }
    Ok(())
}

/// At most [`MAX_EXEC_ENTRIES`] variables, names a shell accepts, values without NUL.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), Error> {
    if env.len() > MAX_EXEC_ENTRIES {
        return Err(invalid(
            "env",
            format!("`env` may have at most {MAX_EXEC_ENTRIES} entries"),
        ));
    }
    for (name, value) in env {
        let valid = !name.is_empty()
            && name.len() <= MAX_ENV_NAME_BYTES
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(invalid(
                "env",
                format!(
                    "`env`: a variable name must be 1 to {MAX_ENV_NAME_BYTES} of A-Z, a-z, \
                     0-9 and '_', not starting with a digit"
                ),
            ));
        }
        if value.contains('\0') {
            let field = format!("env.{name}");
            return Err(invalid(
                &field,
                format!("`{field}` contains a NUL character"),
            ));
        }
    }
    Ok(())
}

/// Checks, authorizes (`sandgate.action`, `exec`) and starts a command: the module
/// contract's steps for an exec, shared by every front end.
pub async fn start_command(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    request: ExecRequest,
) -> Result<ExecStream, Error> {
    let (located, adapter, spec) = authorize_exec(ctx, caller, id, "exec", request).await?;
    let stream = adapter
        .exec(instance(&located), spec)
        .await
        .map_err(|e| op_failed(ctx, id, e))?;
    metrics::counter!("sandgate_sandbox_execs_total").increment(1);
    Ok(stream.exit_on_cancel())
}

/// The steps every way of starting a command shares: the request checked, authorized as
/// `operation` of the action layer on a running sandbox (policy sees the command as
/// `input.exec`), and its user accepted by the provider (an unknown user is refused, never
/// ignored). Returns the sandbox, its provider and the spec to start.
pub(super) async fn authorize_exec(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    operation: &'static str,
    request: ExecRequest,
) -> Result<(Located, Arc<dyn Provider>, ExecSpec), Error> {
    check_exec(&request)?;
    let detail = OperationDetail::Exec {
        argv: &request.argv,
        cwd: request.cwd.as_deref(),
        env_names: request.env.keys().map(String::as_str).collect(),
        user: request.user.as_deref(),
    };
    let (located, adapter) = authorize(
        ctx,
        caller,
        id,
        Layer::Action,
        operation,
        detail,
        &["running"],
    )
    .await?;
    if let Some(user) = &request.user {
        adapter
            .exec_user(user)
            .map_err(super::authorize::op_error)?;
    }
    let spec = ExecSpec {
        argv: request.argv,
        env: request.env,
        cwd: request.cwd,
        timeout: request.timeout_ms.map(Duration::from_millis),
        user: request.user,
    };
    Ok((located, adapter, spec))
}

/// Authorizes `exec` on a live sandbox without starting anything: for acting on a command
/// already running (cancel, signal, input), `detail` naming it.
pub async fn authorize_running_command(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    detail: OperationDetail<'_>,
) -> Result<(), Error> {
    authorize(ctx, caller, id, Layer::Action, "exec", detail, super::LIVE)
        .await
        .map(|_| ())
}

/// Authorizes cancelling a running command ([`authorize_running_command`]) and refuses it,
/// `unsupported` naming the provider, when the sandbox's provider cannot kill one: an answer
/// of "cancelled" would be a lie while the command goes on there.
pub async fn authorize_cancel(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    detail: OperationDetail<'_>,
) -> Result<(), Error> {
    let (_, adapter) =
        authorize(ctx, caller, id, Layer::Action, "exec", detail, super::LIVE).await?;
    if adapter.cancels_commands() {
        return Ok(());
    }
    let e = crate::providers::OpError::unsupported(adapter.kind(), "exec.cancel");
    Err(super::authorize::op_error(e))
}
