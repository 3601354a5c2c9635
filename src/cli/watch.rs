//! `sandgate sandbox watch ID PATH`: a directory's changes, one line per event, as the API's
//! `/v1/sandboxes/{id}/watch` stream sends them (see `api::watch`).
//!
//! With `-o table` (the default on a terminal) a line is `<type> <name>` (`create
//! sub/a.txt`; `overflow <reason>` where events were lost); with `-o json` (the default
//! into a pipe) or `-o yaml` each line is the event's JSON object. The command runs until
//! the watch ends: exit 0 when the gateway ends it (the sandbox stopped or was deleted, the
//! directory was removed), 1 when the stream broke, the usual codes when the API refused.

use std::io::Write;

use serde_json::Value;

use super::output::{self, Format, OutputArgs};
use super::term::clean;
use super::{encode, Api, CliError};

pub(super) async fn watch(
    api: &Api,
    out: &OutputArgs,
    id: &str,
    path: &str,
    recursive: bool,
) -> Result<i32, CliError> {
    let url = format!("{}/v1/sandboxes/{}/watch", api.base, encode(id));
    // No overall timeout: a watch lasts as long as the user wants it.
    let http = reqwest::Client::new();
    let recursive = if recursive { "true" } else { "false" };
    let mut resp = http
        .get(&url)
        .query(&[("path", path), ("recursive", recursive)])
        .bearer_auth(&api.token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .map_err(|e| api.failed(&url, e))?;
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| api.failed(&url, e))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        eprint!("{}", output::api_error(out.output, status, &body));
        return Ok(output::exit_code(status));
    }
    let json = matches!(out.format(), Format::Json | Format::Yaml);
    let mut pending: Vec<u8> = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| api.failed(&url, e))? {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let Ok(event) = serde_json::from_slice::<Value>(data) else {
                continue;
            };
            if event["type"] == "end" {
                return Ok(output::OK);
            }
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{}", line_of(&event, json));
            let _ = stdout.flush();
        }
    }
    eprintln!("error: the watch stream broke before the gateway ended it");
    Ok(output::FAILED)
}

/// One event as printed.
fn line_of(event: &Value, json: bool) -> String {
    if json {
        return event.to_string();
    }
    let kind = event["type"].as_str().unwrap_or("?");
    let what = event["name"]
        .as_str()
        .or_else(|| event["reason"].as_str())
        .unwrap_or_default();
    format!("{:<8} {}", clean(kind), clean(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_print_as_lines_with_control_characters_escaped() {
        let event = serde_json::json!({"type": "create", "name": "a\nb.txt"});
        assert_eq!(line_of(&event, false), "create   a\\nb.txt");
        assert_eq!(
            line_of(&event, true),
            r#"{"name":"a\nb.txt","type":"create"}"#
        );
        let lost = serde_json::json!({"type": "overflow", "reason": "the reader fell behind"});
        assert_eq!(line_of(&lost, false), "overflow the reader fell behind");
    }
}
