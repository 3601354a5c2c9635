//! `sandgate logs [-f] [--sandbox ID] [--workspace WS] [--deny] [--layer L] [--since 10m]
//! [--limit N] [-o table|wide|json] [--url URL]`: a running gateway's recent decisions
//! (`GET /v1/decisions`), or with `-f` its live ones (`GET /v1/decisions/stream`).
//!
//! `-o table` (the default): one line per decision, oldest first: time, sandbox, layer,
//! decision, what was decided (an egress request's `METHOD host:port/path`, an operation's
//! name) and the reason, each cleaned of control characters (a record carries text a
//! sandbox chose). `-o wide` adds the workspace and the record's kind (egress, policy). `-o json` (or its
//! alias `--json`) prints each record as the API gives it, one JSON object per line.
//! Unlike the other commands, the default stays the human lines in a pipe too: a log is
//! read line by line (`grep`, `tail`), and the lines are already one record each, so they
//! do not have the table's data-dependent widths.
//!
//! Without `-f`, the `--limit` most recent matching decisions (default 100); with `-f`, the
//! ones since `--since` (none without it) and then every new one until interrupted,
//! reconnecting with `Last-Event-ID` when the connection drops. Errors follow the output
//! contract ([`output`]): on stderr, `error: <code>: <message>` (the API's error body with
//! `-o json`), stdout empty, exit 1 (3 when the API answers not found, 2 for usage).

use std::io::Write;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use super::output::Format;
use super::term::clean;
use super::{output, Api, CliError};

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// Follow new decisions as they are made.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only this sandbox's decisions (its id, `sb-…`).
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Only this workspace's decisions (an admin token's choice; others see their own).
    #[arg(long)]
    pub workspace: Option<String>,
    /// Only refusals (deny and evaluation errors).
    #[arg(long)]
    pub deny: bool,
    /// Only this policy layer (egress, credential, creation, provider, lifecycle, action).
    #[arg(long)]
    pub layer: Option<String>,
    /// Only decisions since then: a duration (30s, 10m, 24h) or an RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// How many of the most recent decisions to print (without -f).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Output format: `table` (one line per decision), `wide` (with the workspace and the
    /// record's kind) or `json` (each record as the API gives it, one per line) [default: table].
    #[arg(long, short = 'o', value_parser = ["table", "wide", "json"])]
    pub output: Option<String>,
    /// Alias of `-o json`.
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
    /// The gateway: `--url`, `--token`, `--config` as every client command finds it.
    #[command(flatten)]
    pub gateway: super::GatewayArgs,
}

impl LogsArgs {
    /// The format `-o`/`--json` select.
    pub fn format(&self) -> Format {
        match (self.json, self.output.as_deref()) {
            (true, _) | (_, Some("json")) => Format::Json,
            (_, Some("wide")) => Format::Wide,
            _ => Format::Table,
        }
    }

    /// The format errors are printed in (the API's body with `-o json`).
    pub fn error_format(&self) -> Option<Format> {
        Some(self.format()).filter(|f| *f == Format::Json)
    }
}

/// The query parameters the flags select.
fn filters(args: &LogsArgs) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    let pairs = [
        ("sandbox", &args.sandbox),
        ("workspace", &args.workspace),
        ("layer", &args.layer),
        ("since", &args.since),
    ];
    for (key, value) in pairs {
        if let Some(v) = value {
            q.push((key, v.clone()));
        }
    }
    if args.deny {
        q.push(("decision", "deny".into()));
    }
    q
}

fn api(url: Option<&str>) -> Result<Api, CliError> {
    match url {
        Some(url) => Api::to(url.to_string()),
        None => Api::from_env(),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Usage(format!("cannot start the async runtime: {e}")))
}

/// `sandgate logs`.
pub fn logs(args: &LogsArgs) -> Result<i32, CliError> {
    let api = args.gateway.connect()?;
    let query = filters(args);
    let runtime = runtime()?;
    let format = args.format();
    if args.follow {
        return runtime.block_on(follow(&api, &query, format));
    }
    match runtime.block_on(fetch(&api, &query, args.limit))? {
        Ok(mut records) => {
            records.reverse();
            let mut out = std::io::stdout().lock();
            for record in &records {
                let _ = writeln!(out, "{}", render(record, format));
            }
            Ok(0)
        }
        Err((status, error)) => {
            eprint!("{}", output::api_error(args.error_format(), status, &error));
            Ok(output::exit_code(status))
        }
    }
}

/// Up to `limit` matching records, newest first, paging as needed; `Err` holds the API's
/// error answer and its status.
pub(super) async fn fetch(
    api: &Api,
    query: &[(&'static str, String)],
    limit: usize,
) -> Result<Result<Vec<Value>, (u16, Value)>, CliError> {
    let url = format!("{}/v1/decisions", api.base);
    let mut records = Vec::new();
    let mut cursor: Option<String> = None;
    while records.len() < limit {
        let page = (limit - records.len()).min(1000);
        let mut q: Vec<(&str, String)> = query.to_vec();
        q.push(("limit", page.to_string()));
        if let Some(c) = &cursor {
            q.push(("cursor", c.clone()));
        }
        let (status, body) = api.send(api.http.get(&url).query(&q), &url).await?;
        if !(200..300).contains(&status) {
            return Ok(Err((status, body)));
        }
        if let Some(items) = body["decisions"].as_array() {
            records.extend(items.iter().cloned());
        }
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    Ok(Ok(records))
}

/// Records, oldest first, one JSON line each, that a gateway kept since `since`: every
/// record it has (the ring's bound is the only limit), for `policy replay --since`.
pub(super) fn fetch_lines(
    url: Option<&str>,
    since: &str,
) -> Result<Vec<u8>, crate::policy::replay::ReplayError> {
    let failed = |reason: String| crate::policy::replay::ReplayError::File {
        file: "GET /v1/decisions".into(),
        reason,
    };
    let api = api(url).map_err(|e| failed(e.to_string()))?;
    let query = [("since", since.to_string())];
    let fetched = runtime()
        .and_then(|rt| rt.block_on(fetch(&api, &query, usize::MAX)))
        .map_err(|e| failed(e.to_string()))?;
    let mut records =
        fetched.map_err(|(_, error)| failed(error["error"]["message"].to_string()))?;
    records.reverse();
    let mut lines = Vec::new();
    for record in &records {
        lines.extend_from_slice(record.to_string().as_bytes());
        lines.push(b'\n');
    }
    Ok(lines)
}

/// Follows the stream until interrupted; reconnects (after a second) from the last event.
async fn follow(
    api: &Api,
    query: &[(&'static str, String)],
    format: Format,
) -> Result<i32, CliError> {
    let url = format!("{}/v1/decisions/stream", api.base);
    // The stream never ends by itself: no overall timeout on it.
    let http = reqwest::Client::new();
    let mut last_id: Option<String> = None;
    loop {
        let mut req = http.get(&url).query(query).bearer_auth(&api.token);
        if let Some(id) = &last_id {
            req = req.header("last-event-id", id);
        }
        match req.send().await {
            Ok(resp) if resp.status().is_success() => {
                read_events(resp, &mut last_id, format).await;
            }
            Ok(resp) if resp.status().is_client_error() => {
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap_or_default();
                let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
                let error_format = Some(format).filter(|f| *f == Format::Json);
                eprint!("{}", output::api_error(error_format, status, &body));
                return Ok(output::exit_code(status));
            }
            Ok(resp) => eprintln!(
                "sandgate logs: the gateway answered {}; retrying",
                resp.status()
            ),
            Err(e) => eprintln!("sandgate logs: {url}: {e}; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Prints each `decision` event of one connection; returns when it ends.
async fn read_events(resp: reqwest::Response, last_id: &mut Option<String>, format: Format) {
    let mut body = resp.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let (mut event, mut data, mut id) = (String::new(), String::new(), None::<String>);
    while let Some(Ok(chunk)) = body.next().await {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if event == "decision" {
                    if let Ok(record) = serde_json::from_str::<Value>(&data) {
                        println!("{}", render(&record, format));
                    }
                } else if event == "gap" {
                    eprintln!(
                        "sandgate logs: some decisions were evicted before they could be read"
                    );
                }
                if id.is_some() {
                    *last_id = id.take();
                }
                event.clear();
                data.clear();
            } else if let Some(v) = line.strip_prefix("event:") {
                event = v.trim_start().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            } else if let Some(v) = line.strip_prefix("id:") {
                id = Some(v.trim().to_string());
            }
        }
    }
}

/// One record as printed: its JSON (`-o json`, `-o yaml` has no line form), or the human
/// line (`-o wide`: with the workspace and the record's kind at the end).
pub fn render(record: &Value, format: Format) -> String {
    if matches!(format, Format::Json | Format::Yaml) {
        return record.to_string();
    }
    let text = |v: &Value| v.as_str().map(str::to_string);
    let ts = text(&record["ts"]).or_else(|| text(&record["timestamp"]));
    let sandbox = text(&record["sandbox"]).or_else(|| text(&record["input"]["sandbox"]["id"]));
    let layer = text(&record["layer"]);
    let decision = text(&record["decision"]);
    let mut fields = vec![
        ts,
        sandbox,
        layer,
        decision,
        Some(what(record)),
        Some(reason(record)),
    ];
    if format == Format::Wide {
        let input = &record["input"];
        let workspace = text(&record["workspace"])
            .or_else(|| text(&input["workspace"]))
            .or_else(|| text(&input["sandbox"]["workspace"]));
        fields.push(workspace);
        fields.push(text(&record["kind"]));
    }
    fields
        .iter()
        .map(|f| match f.as_deref() {
            Some("") | None => "-".to_string(),
            Some(f) => clean(f),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What was decided: `METHOD host:port/path` for egress, else the operation.
fn what(record: &Value) -> String {
    if record["kind"] == "egress" {
        let method = record["method"].as_str().unwrap_or("CONNECT");
        let host = record["host"].as_str().unwrap_or("?");
        let port = record["port"].as_u64().unwrap_or(0);
        let path = record["path"].as_str().unwrap_or("");
        return format!("{method} {host}:{port}{path}");
    }
    let input = &record["input"];
    input["operation"]
        .as_str()
        .or_else(|| input["action"].as_str())
        .or_else(|| record["path"].as_str())
        .unwrap_or("-")
        .to_string()
}

/// Why: the deny reasons (or an allowed request's failure), quoted; `-` when allowed.
fn reason(record: &Value) -> String {
    let reasons = record["reasons"]
        .as_array()
        .filter(|r| !r.is_empty())
        .or_else(|| record["result"]["deny"].as_array());
    let joined = reasons
        .map(|r| {
            r.iter()
                .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    match (joined.is_empty(), record["code"].as_str()) {
        (true, Some(code)) => code.to_string(),
        (true, None) => applied(record),
        (false, _) => format!("{joined:?}"),
    }
}

/// An allowed egress request's credentials, by name (`credentials: github,npm`): the line
/// a user reads to see a secret was injected without the record's JSON. Empty when none.
fn applied(record: &Value) -> String {
    let names: Vec<&str> = record["credentials"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        return String::new();
    }
    format!("credentials: {}", names.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_lines_name_time_sandbox_layer_decision_target_and_reason() {
        let egress = serde_json::json!({"kind": "egress", "ts": "2026-01-01T00:00:00Z",
            "sandbox": "sb1", "layer": "egress", "decision": "deny", "method": "GET",
            "host": "evil.test", "port": 443, "path": "/x", "reasons": ["not allowed\u{1b}[2J"]});
        assert_eq!(
            render(&egress, Format::Table),
            "2026-01-01T00:00:00Z sb1 egress deny GET evil.test:443/x \"not allowed\\u{1b}[2J\""
        );
        let policy = serde_json::json!({"kind": "policy", "timestamp": "t", "layer": "action",
            "decision": "allow", "input": {"operation": "exec", "sandbox": {"id": "sb2"}},
            "result": {"allow": true, "deny": []}});
        assert_eq!(render(&policy, Format::Table), "t sb2 action allow exec -");
        let injected = serde_json::json!({"kind": "egress", "ts": "t", "sandbox": "sb3",
            "layer": "egress", "decision": "allow", "method": "GET", "host": "api.github.com",
            "port": 443, "path": "/user", "credentials": ["github", "gh\u{1b}[2J"]});
        assert_eq!(
            render(&injected, Format::Table),
            "t sb3 egress allow GET api.github.com:443/user credentials: github,gh\\u{1b}[2J"
        );
        assert_eq!(render(&policy, Format::Json), policy.to_string());
        let wide = serde_json::json!({"kind": "policy", "ts": "t", "layer": "action",
            "decision": "allow", "input": {"operation": "exec", "workspace": "ws-a"}});
        assert_eq!(
            render(&wide, Format::Wide),
            "t - action allow exec - ws-a policy"
        );
    }

    #[test]
    fn json_is_an_alias_of_o_json_and_table_is_the_default() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            logs: LogsArgs,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("logs").chain(args.iter().copied()))
                .map(|c| c.logs.format())
        };
        assert_eq!(parse(&[]).unwrap(), Format::Table);
        assert_eq!(parse(&["--json"]).unwrap(), Format::Json);
        assert_eq!(parse(&["-o", "json"]).unwrap(), Format::Json);
        assert_eq!(parse(&["-o", "wide"]).unwrap(), Format::Wide);
        assert!(parse(&["-o", "yaml"]).is_err());
        assert!(parse(&["--json", "-o", "table"]).is_err());
    }
}
