//! Client subcommands of the `sandgate` binary: `sandbox create|get|list|delete` talk to a
//! running gateway's API (`SANDGATE_URL`, `SANDGATE_TOKEN`); `route explain` answers on the
//! measured context of the configured store, or of a running gateway with `--url`;
//! `provider check` calls a hosted account once. Output is the API's JSON, pretty-printed on
//! stdout; an API error is printed on stdout too (it is JSON) and the exit status is 1.

mod explain;
mod pools;
mod provider;
pub mod replay;
mod term;
mod wait;
mod why;

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use serde_json::Value;

pub use explain::{route, RouteCommand};
pub use pools::pools;
pub use provider::{provider, ProviderCommand};

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
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox from a JSON create request (see `POST /v1/sandboxes`).
    Create {
        /// The request body (a JSON file, `-` for standard input); default `{}`.
        #[arg(long, short)]
        file: Option<PathBuf>,
        /// Idempotency key: repeating the same create returns the same sandbox.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Follow the create to its end (`GET /v1/sandboxes/{id}/events`): each attempt as it
        /// happens on stderr (a live spinner on a terminal, one plain line per event
        /// otherwise), then the final sandbox on stdout; exit 1 with the reason when it
        /// failed.
        #[arg(long)]
        wait: bool,
        /// Only plan the create: sends `"dry_run": true` in the body and prints the answer
        /// (`--wait` is ignored).
        #[arg(long)]
        dry_run: bool,
    },
    /// Show a sandbox: state, placement, attempts, egress settings.
    Get {
        id: String,
        /// Explain the placement instead: the routing record kept when the create was
        /// accepted (every pool's eligibility, unmet requirements, rank keys and measured
        /// values then) next to the attempts, as a table.
        #[arg(long)]
        why: bool,
    },
    /// List sandboxes of a workspace.
    List {
        #[arg(long)]
        workspace: Option<String>,
        #[arg(long)]
        state: Option<String>,
        /// `key=value`
        #[arg(long)]
        label: Option<String>,
        #[arg(long)]
        limit: Option<u32>,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Delete a sandbox (its proxy identity is revoked at once).
    Delete { id: String },
    /// Run a command in a sandbox: its output streams to this terminal's stdout and
    /// stderr, and sandgate exits with the command's exit code (128+N when killed by signal
    /// N, 124 on timeout, 125 when the API refused or failed).
    Exec {
        id: String,
        /// Working directory inside the sandbox.
        #[arg(long)]
        cwd: Option<String>,
        /// Extra environment variable, `KEY=VALUE` (repeatable).
        #[arg(long = "env", short = 'e')]
        env: Vec<String>,
        /// Kill the command after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Stop a sandbox: every process is killed, files stay.
    Stop { id: String },
    /// Start a stopped sandbox.
    Start { id: String },
    /// Pause a sandbox (freeze every process).
    Pause { id: String },
    /// Resume a paused sandbox.
    Resume { id: String },
    /// Snapshot a sandbox's files (create from it with `"snapshot": "<id>"`).
    Snapshot { id: String },
    /// Files of a sandbox.
    #[command(subcommand)]
    Files(FilesCommand),
}

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// Print a file's bytes on stdout.
    Read { id: String, path: String },
    /// Write a file from a local file (or standard input with `-`).
    Write {
        id: String,
        path: String,
        /// Local source; `-` for standard input.
        #[arg(long, default_value = "-")]
        from: PathBuf,
    },
    /// List a directory.
    Ls { id: String, path: String },
    /// Delete a file or (with `-r`) a directory tree.
    Rm {
        id: String,
        path: String,
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Create a directory (with its parents with `-p`).
    Mkdir {
        id: String,
        path: String,
        #[arg(short = 'p', long)]
        parents: bool,
    },
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

fn print(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// Where `sandgate serve` on its embedded defaults writes its local admin token.
const LOCAL_TOKEN_FILE: &str = "data/api-token";

struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    fn from_env() -> Result<Api, CliError> {
        Api::to(std::env::var("SANDGATE_URL").unwrap_or_else(|_| "http://127.0.0.1:7070".into()))
    }

    /// A client of the gateway at `base`, with the token from the environment.
    fn to(base: String) -> Result<Api, CliError> {
        // Without SANDGATE_TOKEN, the token `sandgate serve` generates on its embedded
        // defaults (in ./data, next to the database) is used when it is there.
        let token = match std::env::var("SANDGATE_TOKEN") {
            Ok(token) => token,
            Err(_) => std::fs::read_to_string(LOCAL_TOKEN_FILE)
                .map(|t| t.trim().to_string())
                .map_err(|_| {
                    CliError::Usage(format!(
                        "set SANDGATE_TOKEN to an API token from [[api.tokens]] (on the embedded defaults, `sandgate serve` writes one to {LOCAL_TOKEN_FILE})"
                    ))
                })?,
        };
        crate::tls::install_default_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| CliError::Http {
                url: base.clone(),
                message: e.to_string(),
            })?;
        Ok(Api {
            base: base.trim_end_matches('/').to_string(),
            token,
            http,
        })
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<(u16, Value), CliError> {
        let err = |e: reqwest::Error| CliError::Http {
            url: url.to_string(),
            message: e.to_string(),
        };
        let resp = req.bearer_auth(&self.token).send().await.map_err(err)?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(err)?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }
}

/// `sandgate sandbox ...`: the exit status is 0 for a 2xx answer, 1 otherwise.
pub fn sandbox(cmd: SandboxCommand) -> Result<i32, CliError> {
    let api = Api::from_env()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Usage(format!("cannot start the async runtime: {e}")))?;
    let cmd_name = match &cmd {
        SandboxCommand::Stop { .. } => Some("stop".to_string()),
        SandboxCommand::Start { .. } => Some("start".to_string()),
        SandboxCommand::Pause { .. } => Some("pause".to_string()),
        SandboxCommand::Resume { .. } => Some("resume".to_string()),
        SandboxCommand::Snapshot { .. } => Some("snapshot".to_string()),
        _ => None,
    };
    runtime.block_on(async move {
        let (status, body) = match cmd {
            SandboxCommand::Create {
                file,
                idempotency_key,
                wait,
                dry_run,
            } => {
                let mut body = match &file {
                    Some(path) => read_json(path)?,
                    None => Value::Object(Default::default()),
                };
                if dry_run {
                    let Some(fields) = body.as_object_mut() else {
                        return Err(CliError::Usage(
                            "--dry-run needs the request body to be a JSON object".into(),
                        ));
                    };
                    fields.insert("dry_run".into(), Value::Bool(true));
                }
                let url = format!("{}/v1/sandboxes", api.base);
                let mut req = api.http.post(&url).json(&body);
                if let Some(key) = &idempotency_key {
                    req = req.header("idempotency-key", key);
                }
                let (status, created) = api.send(req, &url).await?;
                if wait && !dry_run {
                    wait::follow(&api, status, created).await?
                } else {
                    (status, created)
                }
            }
            SandboxCommand::Get { id, why } => {
                let url = format!("{}/v1/sandboxes/{id}", api.base);
                let (status, body) = api.send(api.http.get(&url), &url).await?;
                if why && status == 200 {
                    print!("{}", why::render(&body));
                    return Ok(0);
                }
                (status, body)
            }
            SandboxCommand::List {
                workspace,
                state,
                label,
                limit,
                cursor,
            } => {
                let mut url = format!("{}/v1/sandboxes", api.base);
                let mut sep = '?';
                for (k, v) in [
                    ("workspace", workspace),
                    ("state", state),
                    ("label", label),
                    ("limit", limit.map(|l| l.to_string())),
                    ("cursor", cursor),
                ] {
                    if let Some(v) = v {
                        url.push_str(&format!("{sep}{k}={}", encode(&v)));
                        sep = '&';
                    }
                }
                api.send(api.http.get(&url), &url).await?
            }
            SandboxCommand::Delete { id } => {
                let url = format!("{}/v1/sandboxes/{id}", api.base);
                api.send(api.http.delete(&url), &url).await?
            }
            SandboxCommand::Exec {
                id,
                cwd,
                env,
                timeout,
                argv,
            } => return exec(&api, &id, cwd, env, timeout, argv).await,
            SandboxCommand::Stop { id }
            | SandboxCommand::Start { id }
            | SandboxCommand::Pause { id }
            | SandboxCommand::Resume { id }
            | SandboxCommand::Snapshot { id } => {
                let op = cmd_name.as_deref().unwrap_or_default();
                let url = format!("{}/v1/sandboxes/{id}/{op}", api.base);
                api.send(api.http.post(&url), &url).await?
            }
            SandboxCommand::Files(files) => return files_command(&api, files).await,
        };
        print(&body);
        Ok(if (200..300).contains(&status) { 0 } else { 1 })
    })
}

/// Exit status when the API refused or failed an exec (as `docker run` does).
const EXEC_API_FAILURE: i32 = 125;

async fn exec(
    api: &Api,
    id: &str,
    cwd: Option<String>,
    env: Vec<String>,
    timeout: Option<u64>,
    argv: Vec<String>,
) -> Result<i32, CliError> {
    use std::io::Write as _;
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
    let url = format!("{}/v1/sandboxes/{id}/exec", api.base);
    let err = |e: reqwest::Error| CliError::Http {
        url: url.clone(),
        message: e.to_string(),
    };
    // No overall timeout: a command may run for as long as it needs.
    let http = reqwest::Client::new();
    let mut resp = http
        .post(&url)
        .bearer_auth(&api.token)
        .json(&body)
        .send()
        .await
        .map_err(err)?;
    if !resp.status().is_success() {
        let text = resp.text().await.map_err(err)?;
        eprintln!("{text}");
        return Ok(EXEC_API_FAILURE);
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut code = EXEC_API_FAILURE;
    while let Some(chunk) = resp.chunk().await.map_err(err)? {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let Ok(event) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            let bytes = || -> Vec<u8> {
                if let Some(text) = event["text"].as_str() {
                    return text.as_bytes().to_vec();
                }
                use base64::Engine as _;
                event["base64"]
                    .as_str()
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .unwrap_or_default()
            };
            match event["type"].as_str() {
                Some("stdout") => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&bytes());
                    let _ = out.flush();
                }
                Some("stderr") => {
                    let mut out = std::io::stderr().lock();
                    let _ = out.write_all(&bytes());
                    let _ = out.flush();
                }
                Some("exit") => {
                    code = match (
                        event["reason"].as_str(),
                        event["code"].as_i64(),
                        event["signal"].as_i64(),
                    ) {
                        (Some("timed_out"), _, _) => 124,
                        (_, Some(c), _) => c as i32,
                        (_, None, Some(sig)) => 128 + sig as i32,
                        _ => EXEC_API_FAILURE,
                    };
                }
                _ => {}
            }
        }
    }
    Ok(code)
}

async fn files_command(api: &Api, cmd: FilesCommand) -> Result<i32, CliError> {
    use std::io::Write as _;
    let base = |id: &str, what: &str, path: &str| {
        format!(
            "{}/v1/sandboxes/{id}/{what}?path={}",
            api.base,
            encode(path)
        )
    };
    let (status, body) = match cmd {
        FilesCommand::Read { id, path } => {
            let url = base(&id, "files/content", &path);
            let err = |e: reqwest::Error| CliError::Http {
                url: url.clone(),
                message: e.to_string(),
            };
            let resp = api
                .http
                .get(&url)
                .bearer_auth(&api.token)
                .send()
                .await
                .map_err(err)?;
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.map_err(err)?;
            if (200..300).contains(&status) {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&bytes);
                let _ = out.flush();
                return Ok(0);
            }
            eprintln!("{}", String::from_utf8_lossy(&bytes));
            return Ok(1);
        }
        FilesCommand::Write { id, path, from } => {
            let data = if from.as_os_str() == "-" {
                let mut buf = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).map_err(|source| {
                    CliError::Read {
                        path: from.clone(),
                        source,
                    }
                })?;
                buf
            } else {
                std::fs::read(&from).map_err(|source| CliError::Read {
                    path: from.clone(),
                    source,
                })?
            };
            let url = base(&id, "files/content", &path);
            api.send(api.http.put(&url).body(data), &url).await?
        }
        FilesCommand::Ls { id, path } => {
            let url = base(&id, "files", &path);
            api.send(api.http.get(&url), &url).await?
        }
        FilesCommand::Rm {
            id,
            path,
            recursive,
        } => {
            let url = format!("{}&recursive={recursive}", base(&id, "files", &path));
            api.send(api.http.delete(&url), &url).await?
        }
        FilesCommand::Mkdir { id, path, parents } => {
            let url = format!("{}&parents={parents}", base(&id, "files/mkdir", &path));
            api.send(api.http.post(&url), &url).await?
        }
    };
    if body != Value::String(String::new()) {
        print(&body);
    }
    Ok(if (200..300).contains(&status) { 0 } else { 1 })
}
