//! The output contract every client command shares (`sandbox`, `pools`, `credential`,
//! `delegation`).
//!
//! - `-o table` (aligned columns), `-o wide` (more columns), `-o json` (the API's body as it
//!   is, pretty-printed), `-o yaml` (the same document as YAML); `-q` prints only the ids, one
//!   per line.
//! - The default is a table when stdout is a terminal and JSON when it is not. kubectl
//!   prints tables even into a pipe; we chose the `gh`/`docker --format` habit instead:
//!   whatever reads a pipe is a program, and a program wants the stable document, not
//!   columns whose width depends on the data (and every script written against the earlier
//!   JSON-only CLI keeps working). Ask for `-o table` to get columns in a pipe.
//! - No colour or other escape sequence is ever written, and text from the server has its
//!   control characters escaped ([`super::term::clean`]), so a table is the same bytes on a
//!   terminal and in a file.
//! - Errors go to stderr only, one shape: `error: <code>: <message>`, then one indented line
//!   per detail; with `-o json` the API's error body itself. Stdout stays empty.
//!
//! Exit codes: [`OK`] 0, [`FAILED`] 1 (the operation failed or was refused), [`USAGE`] 2
//! (bad arguments, unreadable input, an invalid configuration), [`NOT_FOUND`] 3;
//! `sandbox exec` keeps the command's own code, 124 on timeout, 125 when the API refused.

use std::io::IsTerminal;

use serde_json::Value;

use super::term::{aligned, clean};

/// Success.
pub const OK: i32 = 0;
/// The operation failed or was refused (an API error other than not found).
pub const FAILED: i32 = 1;
/// Usage or configuration error: bad arguments, unreadable input, invalid configuration.
pub const USAGE: i32 = 2;
/// What the command names does not exist (API 404).
pub const NOT_FOUND: i32 = 3;

/// `-o`: how a command's answer is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The API's JSON body, pretty-printed (the default when stdout is not a terminal).
    Json,
    /// The API's body as YAML.
    Yaml,
    /// Aligned columns (the default on a terminal).
    Table,
    /// The table with more columns.
    Wide,
}

/// The output options of every client command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OutputArgs {
    /// Output format [default: table on a terminal, json otherwise].
    #[arg(long, short = 'o', value_enum, global = true)]
    pub output: Option<Format>,
    /// Print only ids (sandbox ids, pool or credential names), one per line.
    #[arg(long, short = 'q', global = true)]
    pub quiet: bool,
}

impl OutputArgs {
    /// `-o`, or the default for where stdout goes.
    pub fn format(&self) -> Format {
        self.output.unwrap_or_else(|| {
            if std::io::stdout().is_terminal() {
                Format::Table
            } else {
                Format::Json
            }
        })
    }
}

/// How one kind of answer is shown as a table: its columns, its rows and its ids.
pub(super) struct Shape {
    /// Column titles of `-o table`.
    pub header: &'static [&'static str],
    /// Extra columns of `-o wide`, after the others.
    pub wide: &'static [&'static str],
    /// The items of a body (the list's array, or the body itself for one item).
    pub items: fn(&Value) -> Vec<&Value>,
    /// One item's cells: `header.len()` of them, or `header.len() + wide.len()` when wide.
    pub row: fn(&Value, bool) -> Vec<String>,
    /// One item's id, for `-q`.
    pub id: fn(&Value) -> String,
}

/// The items of a list body's `key` array.
pub(super) fn list_of<'a>(body: &'a Value, key: &str) -> Vec<&'a Value> {
    body[key]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// The body itself, as the one item.
pub(super) fn single(body: &Value) -> Vec<&Value> {
    vec![body]
}

/// Renders a successful body in `format` (ids only when `quiet`).
pub(super) fn render(format: Format, quiet: bool, body: &Value, shape: &Shape) -> String {
    if quiet {
        return (shape.items)(body)
            .into_iter()
            .map(|item| format!("{}\n", clean(&(shape.id)(item))))
            .collect();
    }
    match format {
        Format::Json => document(body),
        Format::Yaml => yaml(body),
        // An answer without columns (a plan) stays a document.
        Format::Table | Format::Wide if shape.header.is_empty() => document(body),
        Format::Table | Format::Wide => table(body, shape, format == Format::Wide),
    }
}

/// The columns of `shape` for a body.
pub(super) fn table(body: &Value, shape: &Shape, wide: bool) -> String {
    let mut header: Vec<String> = shape.header.iter().map(|h| h.to_string()).collect();
    if wide {
        header.extend(shape.wide.iter().map(|h| h.to_string()));
    }
    let mut rows = vec![header];
    rows.extend(
        (shape.items)(body)
            .into_iter()
            .map(|i| (shape.row)(i, wide)),
    );
    aligned(&rows)
}

/// Pretty JSON with a final newline.
pub(super) fn document(body: &Value) -> String {
    let mut text = serde_json::to_string_pretty(body).unwrap_or_else(|_| body.to_string());
    text.push('\n');
    text
}

fn yaml(body: &Value) -> String {
    serde_norway::to_string(body).unwrap_or_else(|_| document(body))
}

/// The exit code of an API answer's HTTP status.
pub fn exit_code(status: u16) -> i32 {
    match status {
        200..=299 => OK,
        404 => NOT_FOUND,
        _ => FAILED,
    }
}

/// An API error answer as printed on stderr: `-o json` gives the body itself; otherwise
/// `error: <code>: <message>` and one `  <key>: <value>` line per detail. A body that is
/// not sandgate's error shape (a proxy's page, say) shows as `http_<status>` and its text.
pub fn api_error(format: Option<Format>, status: u16, body: &Value) -> String {
    let error = &body["error"];
    let (Some(code), Some(message)) = (error["code"].as_str(), error["message"].as_str()) else {
        let text = match body {
            Value::String(s) => s.chars().take(512).collect::<String>(),
            other => other.to_string(),
        };
        return error_line(format, &format!("http_{status}"), text.trim(), &Value::Null);
    };
    if format == Some(Format::Json) {
        return document(body);
    }
    error_line(None, code, message, &error["details"])
}

/// One error in the contract's shape (`-o json`: `{"error": {code, message, details}}`).
pub fn error_line(format: Option<Format>, code: &str, message: &str, details: &Value) -> String {
    if format == Some(Format::Json) {
        let details = if details.is_null() {
            Value::Object(Default::default())
        } else {
            details.clone()
        };
        let body =
            serde_json::json!({"error": {"code": code, "message": message, "details": details}});
        return document(&body);
    }
    let mut out = format!("error: {}: {}\n", clean(code), clean(message));
    if let Some(fields) = details.as_object() {
        for (key, value) in fields {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!("  {}: {}\n", clean(key), clean(&value)));
        }
    }
    out
}

/// How long ago `ms` (Unix milliseconds) was, from `now_ms`, the way `kubectl` shows ages:
/// `45s`, `12m`, `5h`, `3d`.
pub(super) fn age(ms: Option<i64>, now_ms: i64) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let secs = (now_ms - ms).max(0) / 1000;
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        7200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// Now, in Unix milliseconds.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A value as a cell: `-` when absent or empty; control characters escaped.
pub(super) fn cell(v: &Value) -> String {
    match v {
        Value::String(s) if !s.is_empty() => clean(s),
        Value::Null | Value::String(_) => "-".into(),
        other => clean(&other.to_string()),
    }
}

/// A string map (labels) as `k=v,k=v`, `-` when empty.
pub(super) fn pairs(v: &Value) -> String {
    let Some(map) = v.as_object().filter(|m| !m.is_empty()) else {
        return "-".into();
    };
    let parts: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    clean(&parts.join(","))
}
