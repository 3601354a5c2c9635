//! `sandgate delegation mint|list|revoke`: delegated capabilities on one sandbox
//! (`/v1/sandboxes/{id}/delegations`, `/v1/delegations/{id}`). A minted token is printed
//! once (the API shows it only then); with `-q`, only the token, since that is what a
//! script hands to its agent.

use clap::Subcommand;
use serde_json::{json, Value};

use super::output::{age, cell, list_of, now_ms, OutputArgs, Shape};
use super::sandbox::reply;
use super::{encode, run_client, GatewayArgs};

/// What a delegation may allow (the API's list).
const ACTIONS: [&str; 14] = [
    "exec",
    "pty",
    "stdin",
    "ports",
    "files.read",
    "files.write",
    "files.list",
    "files.delete",
    "files.mkdir",
    "stop",
    "start",
    "pause",
    "resume",
    "snapshot",
];

#[derive(Debug, Subcommand)]
pub enum DelegationCommand {
    /// Mint a token that lets an agent perform some of your own actions on one sandbox,
    /// until it expires or is revoked. Every action must be one you may perform now.
    ///
    /// Examples:
    ///   sandgate delegation mint sb-0123 --agent ci-bot --action exec --action files.read
    ///   export AGENT_TOKEN=$(sandgate delegation mint sb-0123 --agent a --action exec --ttl 600 -q)
    #[command(verbatim_doc_comment)]
    Mint {
        /// The sandbox id.
        sandbox: String,
        /// Who the token is for (recorded in every decision it takes part in).
        #[arg(long, value_name = "NAME")]
        agent: String,
        /// An action the agent may perform (repeatable).
        #[arg(long = "action", required = true, value_parser = ACTIONS)]
        actions: Vec<String>,
        /// Lifetime in seconds [default: 3600; at most 7 days].
        #[arg(long, value_name = "SECS")]
        ttl: Option<u64>,
    },
    /// List a sandbox's delegations (never their tokens).
    ///
    /// Example:
    ///   sandgate delegation list sb-0123
    #[command(verbatim_doc_comment)]
    List {
        /// The sandbox id.
        sandbox: String,
    },
    /// Revoke a delegation at once: its token is refused from the next request on.
    ///
    /// Example:
    ///   sandgate delegation revoke dl-0123
    #[command(verbatim_doc_comment)]
    Revoke {
        /// The delegation id (from `mint` or `list`).
        id: String,
    },
}

const DELEGATIONS: Shape = Shape {
    header: &["ID", "SANDBOX", "AGENT", "ACTIONS", "EXPIRES", "REVOKED"],
    wide: &["DELEGATOR", "WORKSPACE", "AGE"],
    items: |body| list_of(body, "delegations"),
    row,
    id: |d| cell(&d["id"]),
};

/// A mint's answer: the delegation with its token as the last column.
const MINTED: Shape = Shape {
    header: &["ID", "SANDBOX", "AGENT", "ACTIONS", "EXPIRES", "TOKEN"],
    wide: &[],
    items: |body| vec![body],
    row: |m, _| {
        let mut row = row(&m["delegation"], false);
        row.pop();
        row.push(cell(&m["token"]));
        row
    },
    id: |m| cell(&m["token"]),
};

/// `sandgate delegation ...`.
pub fn delegation(cmd: DelegationCommand, gateway: &GatewayArgs, out: &OutputArgs) -> i32 {
    run_client(gateway, out, |api| async move {
        match cmd {
            DelegationCommand::Mint {
                sandbox,
                agent,
                actions,
                ttl,
            } => {
                let url = format!("{}/v1/sandboxes/{}/delegations", api.base, encode(&sandbox));
                let mut body = json!({"agent": agent, "actions": actions});
                if let Some(ttl) = ttl {
                    body["ttl_secs"] = json!(ttl);
                }
                let (s, b) = api.send(api.http.post(&url).json(&body), &url).await?;
                Ok(reply(out, s, &b, &MINTED))
            }
            DelegationCommand::List { sandbox } => {
                let url = format!("{}/v1/sandboxes/{}/delegations", api.base, encode(&sandbox));
                let (s, b) = api.send(api.http.get(&url), &url).await?;
                Ok(reply(out, s, &b, &DELEGATIONS))
            }
            DelegationCommand::Revoke { id } => {
                let url = format!("{}/v1/delegations/{}", api.base, encode(&id));
                let (s, b) = api.send(api.http.delete(&url), &url).await?;
                Ok(super::files::quiet_reply(out, s, &b))
            }
        }
    })
}

fn row(d: &Value, wide: bool) -> Vec<String> {
    let now = now_ms();
    let actions: Vec<String> = d["actions"]
        .as_array()
        .map(|a| a.iter().map(cell).collect())
        .unwrap_or_default();
    let mut row = vec![
        cell(&d["id"]),
        cell(&d["sandbox_id"]),
        cell(&d["agent"]),
        actions.join(","),
        expires(d["expires_ms"].as_i64(), now),
        d["revoked_ms"]
            .as_i64()
            .map(|ms| format!("{} ago", age(Some(ms), now)))
            .unwrap_or_else(|| "-".into()),
    ];
    if wide {
        row.extend([
            cell(&d["delegator"]),
            cell(&d["workspace"]),
            age(d["created_ms"].as_i64(), now),
        ]);
    }
    row
}

/// `in 59m`, or `expired` once past.
fn expires(ms: Option<i64>, now: i64) -> String {
    match ms {
        Some(ms) if ms > now => format!("in {}", age(Some(now), ms)),
        Some(_) => "expired".into(),
        None => "-".into(),
    }
}
