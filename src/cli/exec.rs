//! `sandgate sandbox exec`: runs a command and streams its output; the exit code is the
//! command's (128+N when killed by signal N, 124 on timeout, 125 when the API refused or
//! failed, with the error on stderr in the contract's shape).

use serde_json::Value;

use super::output::{self, OutputArgs};
use super::{encode, Api, CliError};

/// Exit status when the API refused or failed an exec (as `docker run` does).
const EXEC_API_FAILURE: i32 = 125;
/// Exit status when the command ran out of its `--timeout` (as `timeout(1)` does).
const EXEC_TIMED_OUT: i32 = 124;

/// What `sandgate sandbox exec` asks for, from its flags.
pub(super) struct ExecOptions {
    pub cwd: Option<String>,
    /// `KEY=VALUE` pairs.
    pub env: Vec<String>,
    /// Seconds.
    pub timeout: Option<u64>,
    pub user: Option<String>,
    pub argv: Vec<String>,
}

pub(super) async fn exec(
    api: &Api,
    out: &OutputArgs,
    id: &str,
    options: ExecOptions,
) -> Result<i32, CliError> {
    let body = request(options)?;
    let url = format!("{}/v1/sandboxes/{}/exec", api.base, encode(id));
    // No overall timeout: a command may run for as long as it needs.
    let http = reqwest::Client::new();
    let mut resp = http
        .post(&url)
        .bearer_auth(&api.token)
        .json(&body)
        .send()
        .await
        .map_err(|e| api.failed(&url, e))?;
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| api.failed(&url, e))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        eprint!("{}", output::api_error(out.output, status, &body));
        return Ok(EXEC_API_FAILURE);
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut code = EXEC_API_FAILURE;
    while let Some(chunk) = resp.chunk().await.map_err(|e| api.failed(&url, e))? {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Ok(event) = serde_json::from_slice::<Value>(&line) {
                code = on_event(&event).unwrap_or(code);
            }
        }
    }
    Ok(code)
}

fn request(options: ExecOptions) -> Result<Value, CliError> {
    let ExecOptions {
        cwd,
        env,
        timeout,
        user,
        argv,
    } = options;
    let mut vars = serde_json::Map::new();
    for pair in &env {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(CliError::Usage(format!(
                "--env {pair:?}: expected KEY=VALUE"
            )));
        };
        vars.insert(k.to_string(), Value::String(v.to_string()));
    }
    let mut body = serde_json::json!({"argv": argv, "env": vars, "cwd": cwd});
    if let Some(secs) = timeout {
        body["timeout_ms"] = Value::from(secs.saturating_mul(1000));
    }
    if let Some(user) = user {
        body["user"] = Value::String(user);
    }
    Ok(body)
}

/// Writes an output event's bytes where they belong; an `exit` event's code.
fn on_event(event: &Value) -> Option<i32> {
    match event["type"].as_str() {
        Some("stdout") => write_all(&mut std::io::stdout().lock(), &bytes(event)),
        Some("stderr") => write_all(&mut std::io::stderr().lock(), &bytes(event)),
        Some("exit") => return Some(exit_code(event)),
        _ => {}
    }
    None
}

fn write_all(out: &mut dyn std::io::Write, bytes: &[u8]) {
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

fn bytes(event: &Value) -> Vec<u8> {
    if let Some(text) = event["text"].as_str() {
        return text.as_bytes().to_vec();
    }
    use base64::Engine as _;
    event["base64"]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_default()
}

fn exit_code(event: &Value) -> i32 {
    match (
        event["reason"].as_str(),
        event["code"].as_i64(),
        event["signal"].as_i64(),
    ) {
        (Some("timed_out"), _, _) => EXEC_TIMED_OUT,
        (_, Some(c), _) => c as i32,
        (_, None, Some(sig)) => 128 + sig as i32,
        _ => EXEC_API_FAILURE,
    }
}
