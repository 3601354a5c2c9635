//! `sandgate route explain`: how a create request would be routed, on the measured context
//! routing uses, from one of two sources (named on stderr, so stdout stays the explanation):
//!
//! - **the configured store** (default): the pools `serve` would compile from the same
//!   `--config`, and the context rebuilt from its database exactly as the coordinator builds
//!   it (`create::context`): samples in the stats window, live placements, free capacity, the
//!   workspace's Auto order and the `[create]` bands. SQLite readers do not block a running
//!   gateway (WAL), so this works next to it. A store that does not exist yet is not
//!   created: the context is then empty, and stderr says so.
//! - **a running gateway** (`--url`): its `POST /v1/routes:explain`, with `SANDGATE_TOKEN`
//!   (or the local token file) as for `sandgate sandbox`.
//!
//! For the same configuration, store and request both give the same answer; the workspace
//! is the request's `workspace`, else `--workspace` (the gateway uses the caller's).
//! Exit status: 0 when at least one pool is eligible, 1 otherwise (none is, or an error,
//! printed on stderr).

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::Value;

use super::{print, read_json, Api, CliError};
use crate::config::Config;
use crate::create::context::Inputs;
use crate::create::CreateBody;
use crate::store::Store;

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Explain how the configured pools would route a create request, on the measured
    /// context of the configured store (or of a running gateway with `--url`).
    Explain {
        /// The create request (JSON file, `-` for standard input).
        #[arg(long)]
        request: PathBuf,
        /// Ask the gateway at this URL (its `POST /v1/routes:explain`) instead of reading
        /// the configured store.
        #[arg(long)]
        url: Option<String>,
        /// The workspace whose Auto order applies when the request names none.
        #[arg(long)]
        workspace: Option<String>,
    },
}

/// `sandgate route explain`.
pub fn route(cmd: RouteCommand, config: &Config) -> Result<i32, CliError> {
    let RouteCommand::Explain {
        request,
        url,
        workspace,
    } = cmd;
    let raw = read_json(&request)?;
    let body = CreateBody::parse(raw.clone()).map_err(|e| {
        CliError::Usage(format!(
            "{}: `{}`: {}",
            request.display(),
            e.field,
            e.message
        ))
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Usage(format!("cannot start the async runtime: {e}")))?;
    let explanation = runtime.block_on(async {
        match url {
            Some(url) => from_gateway(url, &raw).await,
            None => from_store(config, &body, workspace.as_deref()).await,
        }
    })?;
    print(&explanation);
    let eligible = explanation["order"]
        .as_array()
        .is_some_and(|o| !o.is_empty());
    Ok(if eligible { 0 } else { 1 })
}

async fn from_gateway(url: String, body: &Value) -> Result<Value, CliError> {
    let api = Api::to(url)?;
    let endpoint = format!("{}/v1/routes:explain", api.base);
    eprintln!("explain: measured context of the gateway at {}", api.base);
    let (status, answer) = api
        .send(api.http.post(&endpoint).json(body), &endpoint)
        .await?;
    if status != 200 {
        return Err(CliError::Http {
            url: endpoint,
            message: format!("HTTP {status}: {answer}"),
        });
    }
    Ok(answer)
}

async fn from_store(
    config: &Config,
    body: &CreateBody,
    workspace: Option<&str>,
) -> Result<Value, CliError> {
    let (topology, _local) = crate::server::routing_topology(config)
        .map_err(|e| CliError::Usage(format!("the configuration's pools are invalid: {e}")))?;
    let workspace = body.workspace.as_deref().or(workspace);
    // A Postgres store always exists (it is a server); a SQLite file may not have been
    // created yet, and reading must not create it.
    let store = match &config.store.url {
        Some(_) => Some(Store::open(&config.store).await),
        None if config.store.path.exists() => Some(Store::open(&config.store).await),
        None => None,
    };
    let ctx = if let Some(store) = store {
        let store = store.map_err(|e| CliError::Usage(e.to_string()))?;
        let inputs = Inputs {
            store: &store,
            topology: &topology,
            config: &config.create,
        };
        let (ctx, read) = inputs
            .from_store(Some(&body.request), workspace)
            .await
            .map_err(|e| CliError::Usage(e.to_string()))?;
        eprintln!(
            "explain: measured context of the store at {} ({} samples in the last {} s, {} placements read)",
            store.location(),
            read.samples,
            config.create.stats_window_secs,
            read.sandboxes
        );
        ctx
    } else {
        eprintln!(
            "explain: no store at {} yet: empty context (no samples, no sandboxes)",
            config.store.path.display()
        );
        sandgate_router::RouteContext {
            workspace_order: workspace.and_then(|w| config.create.workspace_order.get(w).cloned()),
            bands: crate::create::context::bands(&config.create),
            ..Default::default()
        }
    };
    let explanation = sandgate_router::explain(&topology, &body.request, &ctx);
    Ok(serde_json::to_value(&explanation).unwrap_or(Value::Null))
}
