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
//! Output follows the contract ([`output`]): `-o table` (the default on a terminal) one row
//! per pool (its position in the order, eligibility, unmet requirements, soft score; `-o
//! wide` adds the rank keys, tier and free capacity) and then the final order; `-o json` (the
//! default in a pipe) the explanation document as the API gives it; `-o yaml` the same as
//! YAML; `-q` the order's pools, one per line.
//! Exit status: 0 when at least one pool is eligible, 1 otherwise (none is, or the gateway
//! refused, its error on stderr), 2 for a usage or input error, 3 when the gateway answers
//! not found.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::Value;

use super::output::{cell, OutputArgs, Shape};
use super::{output, read_json, Api, CliError};
use crate::config::Config;
use crate::create::context::Inputs;
use crate::create::CreateBody;
use crate::store::Store;

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Explain how the configured pools would route a create request, on the measured
    /// context of the configured store (or of a running gateway with `--url`).
    ///
    /// Examples:
    ///   echo '{"regions": ["eu-west-1"]}' | sandgate route explain --request - --config sandgate.toml
    ///   sandgate route explain --request create.json --url http://127.0.0.1:7070
    #[command(verbatim_doc_comment)]
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
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `sandgate route explain`: its exit code; errors are printed by the output contract.
pub fn route(cmd: RouteCommand, config: &Config) -> i32 {
    let RouteCommand::Explain {
        request,
        url,
        workspace,
        output: out,
    } = cmd;
    let result = explain(request, url, workspace.as_deref(), config).map(|answer| match answer {
        Ok(explanation) => print_explanation(&explanation, &out),
        Err((status, body)) => {
            eprint!("{}", output::api_error(out.output, status, &body));
            output::exit_code(status)
        }
    });
    result.unwrap_or_else(|e| e.report(out.output))
}

/// The explanation as `-o` asks; 0 when at least one pool is eligible, else 1.
fn print_explanation(explanation: &Value, out: &OutputArgs) -> i32 {
    print!("{}", render(explanation, out));
    let eligible = explanation["order"]
        .as_array()
        .is_some_and(|o| !o.is_empty());
    if eligible {
        output::OK
    } else {
        output::FAILED
    }
}

/// How `route explain` shows as a table: one row per pool, in the order the JSON lists them.
const SHAPE: Shape = Shape {
    header: &[
        "POOL", "PROVIDER", "REGION", "ELIGIBLE", "POSITION", "SCORE", "UNMET",
    ],
    wide: &["TIER", "FREE", "RANK"],
    items: |body| output::list_of(body, "pools"),
    row: pool_row,
    id: |pool| pool["pool"].as_str().unwrap_or_default().to_string(),
};

fn pool_row(pool: &Value, wide: bool) -> Vec<String> {
    let unmet: Vec<&str> = pool["unmet_requirements"]
        .as_array()
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let position = pool["position"].as_u64().map(|p| (p + 1).to_string());
    let mut row = vec![
        cell(&pool["pool"]),
        cell(&pool["provider"]),
        cell(&pool["region"]),
        if pool["eligible"] == true {
            "yes"
        } else {
            "no"
        }
        .to_string(),
        position.unwrap_or_else(|| "-".into()),
        cell(&pool["soft_score"]),
        cell(&Value::String(unmet.join("; "))),
    ];
    if wide {
        let rank: Vec<String> = pool["rank"]
            .as_array()
            .map(|keys| keys.iter().map(rank_key).collect())
            .unwrap_or_default();
        row.push(cell(&pool["tier"]));
        row.push(cell(&pool["free_capacity"]));
        row.push(cell(&Value::String(rank.join(","))));
    }
    row
}

/// One rank key as `priority=value` (`/band` when banded).
fn rank_key(key: &Value) -> String {
    let priority = key["priority"].as_str().unwrap_or("?");
    let value = match &key["value"] {
        Value::Null => "-".to_string(),
        v => v.to_string(),
    };
    match key["band"].as_i64() {
        Some(band) => format!("{priority}={value}/{band}"),
        None => format!("{priority}={value}"),
    }
}

/// The explanation in the format `out` selects: the table ends with the final order (and
/// the reason when no pool is eligible); `-q` prints the order's pools.
pub(super) fn render(explanation: &Value, out: &OutputArgs) -> String {
    let order: Vec<String> = explanation["order"]
        .as_array()
        .map(|o| o.iter().map(cell).collect())
        .unwrap_or_default();
    if out.quiet {
        return order.iter().map(|p| format!("{p}\n")).collect();
    }
    let format = out.format();
    let mut text = output::render(format, false, explanation, &SHAPE);
    if matches!(format, output::Format::Table | output::Format::Wide) {
        let order = if order.is_empty() {
            "- (no eligible pool)".to_string()
        } else {
            order.join(", ")
        };
        text.push_str(&format!("\nORDER: {order}\n"));
    }
    text
}

/// The explanation from the gateway or the store; `Err` inside holds the gateway's error
/// answer and its status.
fn explain(
    request: PathBuf,
    url: Option<String>,
    workspace: Option<&str>,
    config: &Config,
) -> Result<Result<Value, (u16, Value)>, CliError> {
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
    runtime.block_on(async {
        match url {
            Some(url) => from_gateway(url, &raw).await,
            None => from_store(config, &body, workspace).await.map(Ok),
        }
    })
}

async fn from_gateway(url: String, body: &Value) -> Result<Result<Value, (u16, Value)>, CliError> {
    let api = Api::to(url)?;
    let endpoint = format!("{}/v1/routes:explain", api.base);
    eprintln!("explain: measured context of the gateway at {}", api.base);
    let (status, answer) = api
        .send(api.http.post(&endpoint).json(body), &endpoint)
        .await?;
    if status != 200 {
        return Ok(Err((status, answer)));
    }
    Ok(Ok(answer))
}

async fn from_store(
    config: &Config,
    body: &CreateBody,
    workspace: Option<&str>,
) -> Result<Value, CliError> {
    let (topology, _local) = crate::server::routing_topology(config, config.ports.enabled)
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
