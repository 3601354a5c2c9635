//! How a client command finds its gateway and talks to it.
//!
//! The URL is the first of: `--url`, `SANDGATE_URL`, the `[api] listen` of `--config` (or
//! `SANDGATE_CONFIG`), `http://127.0.0.1:7070`. The token is the first of: `--token`,
//! `SANDGATE_TOKEN`, the configuration's first `[[api.tokens]]` (its `token` or
//! `token_env`) or, when it has none, the local admin token `sandgate serve` generated next
//! to its database, and last `data/api-token` (the embedded defaults' file).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::CliError;
use crate::config::Config;

/// Where `sandgate serve` on its embedded defaults writes its local admin token.
const LOCAL_TOKEN_FILE: &str = "data/api-token";
/// The embedded defaults' API address.
const DEFAULT_URL: &str = "http://127.0.0.1:7070";

/// The gateway options of every client command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GatewayArgs {
    /// The gateway's API, e.g. http://127.0.0.1:7070 [env: SANDGATE_URL; default: the
    /// config's `[api] listen`, else http://127.0.0.1:7070].
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    /// API bearer token [env: SANDGATE_TOKEN; default: from the config, else
    /// data/api-token]. Prefer the environment: other users can read a command line.
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// A gateway configuration file to take the API address and token from [env:
    /// SANDGATE_CONFIG].
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl GatewayArgs {
    /// Only a URL (the `--url` of `logs` and `route explain`).
    pub fn at(url: Option<String>) -> GatewayArgs {
        GatewayArgs {
            url,
            ..GatewayArgs::default()
        }
    }

    /// A client of the gateway these options (and the environment) name.
    pub(crate) fn connect(&self) -> Result<Api, CliError> {
        let config = self
            .config_file()
            .map(|p| Config::load(Some(&p)))
            .transpose()?;
        let base = self
            .url
            .clone()
            .or_else(|| env("SANDGATE_URL"))
            .or_else(|| config.as_ref().map(listen_url))
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        let token = match self.token.clone().or_else(|| env("SANDGATE_TOKEN")) {
            Some(token) => token,
            None => config_token(config.as_ref())?,
        };
        Api::new(base, token)
    }

    fn config_file(&self) -> Option<PathBuf> {
        self.config
            .clone()
            .or_else(|| env("SANDGATE_CONFIG").map(PathBuf::from))
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `http://<[api] listen>`, with an unspecified address (`0.0.0.0`, `[::]`) as loopback.
fn listen_url(config: &Config) -> String {
    let mut addr = config.api.listen;
    if addr.ip().is_unspecified() {
        let loopback: std::net::IpAddr = match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        addr.set_ip(loopback);
    }
    format!("http://{addr}")
}

/// The token a configuration gives the CLI: its first `[[api.tokens]]`, or its generated
/// local admin token; without a configuration, `data/api-token`.
fn config_token(config: Option<&Config>) -> Result<String, CliError> {
    let missing = |why: String| {
        CliError::Usage(format!(
            "no API token: {why}; set SANDGATE_TOKEN or pass --token (an [[api.tokens]] entry's token)"
        ))
    };
    let Some(config) = config else {
        return read_token(Path::new(LOCAL_TOKEN_FILE)).map_err(|_| {
            missing(format!(
                "{LOCAL_TOKEN_FILE} is not here (on the embedded defaults, `sandgate serve` writes it)"
            ))
        });
    };
    if let Some(first) = config.api.tokens.first() {
        if let Some(token) = &first.token {
            return Ok(token.clone());
        }
        let var = first.token_env.as_deref().unwrap_or_default();
        return env(var)
            .ok_or_else(|| missing(format!("{var} (api.tokens[0].token_env) is not set")));
    }
    let file = crate::server::local_token_file(config);
    read_token(&file).map_err(|e| missing(format!("cannot read {}: {e}", file.display())))
}

fn read_token(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_string())
}

/// A client of one gateway's API.
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) token: String,
    pub(crate) http: reqwest::Client,
}

impl Api {
    /// The gateway of `SANDGATE_URL` (or the defaults), as `sandgate sandbox` finds it.
    pub(crate) fn from_env() -> Result<Api, CliError> {
        GatewayArgs::default().connect()
    }

    /// The gateway at `base`, with the token found as [`GatewayArgs::connect`] does.
    pub(crate) fn to(base: String) -> Result<Api, CliError> {
        GatewayArgs::at(Some(base)).connect()
    }

    fn new(base: String, token: String) -> Result<Api, CliError> {
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

    /// Sends with the token; the status and the body (JSON, or the text as a string).
    pub(crate) async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<(u16, Value), CliError> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.failed(url, e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.failed(url, e))?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    /// A request that got no answer; a refused or failed connection says what to do.
    pub(crate) fn failed(&self, url: &str, e: reqwest::Error) -> CliError {
        let message = innermost(&e);
        if e.is_connect() {
            return CliError::Unreachable {
                base: self.base.clone(),
                message,
            };
        }
        CliError::Http {
            url: url.to_string(),
            message,
        }
    }
}

/// The deepest cause of an error (`Connection refused (os error 111)` rather than
/// reqwest's `error sending request for url`).
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &dyn std::error::Error = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}
