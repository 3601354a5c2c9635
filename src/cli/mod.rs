//! Client subcommands of the `sandgate` binary: `sandbox create|get|list|delete` talk to a
//! running gateway's API (`SANDGATE_URL`, `SANDGATE_TOKEN`); `route explain` answers offline
//! from a configuration file. Output is the API's JSON, pretty-printed on stdout; an API
//! error is printed on stdout too (it is JSON) and the exit status is 1.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use serde_json::Value;

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
        /// Wait until the sandbox is running or failed when the API answers 202.
        #[arg(long)]
        wait: bool,
    },
    /// Show a sandbox: state, placement, attempts, egress settings.
    Get { id: String },
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
}

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Explain, offline, how the configured pools would route a create request.
    Explain {
        /// The create request (JSON file, `-` for standard input).
        #[arg(long)]
        request: PathBuf,
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

/// `sandgate route explain`: exit 0 when at least one pool is eligible, 1 otherwise.
pub fn route(cmd: RouteCommand, config: &crate::config::Config) -> Result<i32, CliError> {
    let RouteCommand::Explain { request } = cmd;
    let body = crate::create::CreateBody::parse(read_json(&request)?).map_err(|e| {
        CliError::Usage(format!(
            "{}: `{}`: {}",
            request.display(),
            e.field,
            e.message
        ))
    })?;
    let topology = config
        .router_config()
        .compile()
        .map_err(|e| CliError::Usage(format!("the configuration's pools are invalid: {e}")))?;
    let ctx = sandgate_router::RouteContext::default();
    let explanation = sandgate_router::explain(&topology, &body.request, &ctx);
    let value = serde_json::to_value(&explanation).unwrap_or(Value::Null);
    print(&value);
    Ok(if explanation.order.is_empty() { 1 } else { 0 })
}

struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    fn from_env() -> Result<Api, CliError> {
        let base = std::env::var("SANDGATE_URL").unwrap_or_else(|_| "http://127.0.0.1:7070".into());
        let token = std::env::var("SANDGATE_TOKEN").map_err(|_| {
            CliError::Usage("set SANDGATE_TOKEN to an API token from [[api.tokens]]".into())
        })?;
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
    runtime.block_on(async move {
        let (status, body) = match cmd {
            SandboxCommand::Create {
                file,
                idempotency_key,
                wait,
            } => {
                let body = match &file {
                    Some(path) => read_json(path)?,
                    None => Value::Object(Default::default()),
                };
                let url = format!("{}/v1/sandboxes", api.base);
                let mut req = api.http.post(&url).json(&body);
                if let Some(key) = &idempotency_key {
                    req = req.header("idempotency-key", key);
                }
                let (status, created) = api.send(req, &url).await?;
                if status == 202 && wait {
                    let id = created["id"].as_str().unwrap_or_default().to_string();
                    let url = format!("{}/v1/sandboxes/{id}", api.base);
                    loop {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        let (s, mut current) = api.send(api.http.get(&url), &url).await?;
                        let state = current["state"].as_str().unwrap_or_default().to_string();
                        if s != 200
                            || !["pending", "provisioning", "reconciling"].contains(&state.as_str())
                        {
                            // Keep the token from the create response: GET never shows it.
                            if let Some(egress) = current.get_mut("egress") {
                                egress["token"] = created["egress"]["token"].clone();
                                egress["proxy_url"] = created["egress"]["proxy_url"].clone();
                            }
                            let ok = s == 200 && state == "running";
                            break (if ok { 201 } else { 500 }, current);
                        }
                    }
                } else {
                    (status, created)
                }
            }
            SandboxCommand::Get { id } => {
                let url = format!("{}/v1/sandboxes/{id}", api.base);
                api.send(api.http.get(&url), &url).await?
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
        };
        print(&body);
        Ok(if (200..300).contains(&status) { 0 } else { 1 })
    })
}
