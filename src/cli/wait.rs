//! `sandgate sandbox create --wait`: follows the create through `GET
//! /v1/sandboxes/{id}/events` until its `done` event.
//!
//! On a terminal (stderr), a live spinner shows the current attempt (pool, sandbox state) and
//! each finished attempt stays as one line (pool, outcome, error class, duration, message);
//! otherwise every event is one plain line on stderr. Stdout gets exactly one JSON document at
//! the end: the final sandbox, with the egress token of the create response (`GET` never
//! shows it). A dropped stream is resumed with `Last-Event-ID`, so no attempt is shown twice
//! or missed.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

use super::term::clean;
use super::{Api, CliError};

/// Connection failures in a row (no event received in between) before giving up.
const MAX_RETRIES: u32 = 10;
/// Longer than the server's keep-alive interval (10 s), so only a dead stream times out.
const READ_TIMEOUT: Duration = Duration::from_secs(45);
/// A line longer than this is not from sandgate's event stream.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Follows the create that answered `status` with `created` to its end. Returns the status
/// and body to print: 201 and the final sandbox when it runs, 500 and the final sandbox when
/// it failed (the reason is on stderr), or the create's own answer when it made no sandbox
/// (a refusal such as 400 or 422).
pub(super) async fn follow(
    api: &Api,
    status: u16,
    created: Value,
) -> Result<(u16, Value), CliError> {
    let Some(id) = sandbox_id(&created) else {
        return Ok((status, created));
    };
    let mut reporter = Reporter::new(&id);
    let done = stream_until_done(api, &id, &mut reporter).await;
    reporter.clear();
    let done = done?;
    let url = format!("{}/v1/sandboxes/{id}", api.base);
    let (s, mut current) = api.send(api.http.get(&url), &url).await?;
    if s != 200 {
        return Ok((s, current));
    }
    keep_token(&mut current, &created);
    let running = current["state"] == "running";
    let done = match done {
        Some(done) => done,
        // The stream said everything was delivered already: describe the sandbox as it is.
        None => {
            serde_json::json!({"state": current["state"], "error": current["error"], "placement": current["placement"]})
        }
    };
    eprintln!("{}", done_line(&id, &done));
    Ok((if running { 201 } else { 500 }, current))
}

/// The sandbox a create response names: its `id`, or, for a create that failed, the
/// failure's `details.sandbox_id` (a failed create lists its `details.attempts`; an
/// `idempotency_conflict` names the key's sandbox too, but that is not this create's).
fn sandbox_id(created: &Value) -> Option<String> {
    let details = &created["error"]["details"];
    created["id"]
        .as_str()
        .or_else(|| {
            details["attempts"]
                .is_array()
                .then(|| details["sandbox_id"].as_str())
                .flatten()
        })
        .filter(|id| !id.is_empty())
        .map(str::to_string)
}

/// Copies the egress token from the create response: `GET` never shows it (nor does a
/// replay of the create, which says so).
fn keep_token(current: &mut Value, created: &Value) {
    if let Some(egress) = current.get_mut("egress").and_then(Value::as_object_mut) {
        for field in ["token", "proxy_url", "token_already_shown"] {
            if let Some(v) = created["egress"].get(field) {
                egress.insert(field.to_string(), v.clone());
            }
        }
    }
}

/// Reads the event stream, reconnecting with `Last-Event-ID`, until `done` (its data), or
/// `None` when the server says nothing more will come (204).
async fn stream_until_done(
    api: &Api,
    id: &str,
    reporter: &mut Reporter,
) -> Result<Option<Value>, CliError> {
    let url = format!("{}/v1/sandboxes/{id}/events", api.base);
    let failed = |message: String| CliError::Http {
        url: url.clone(),
        message,
    };
    // No overall timeout (a create may take as long as its pools need); a read timeout
    // instead, which the server's keep-alive comments never let expire on a live stream.
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(READ_TIMEOUT)
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let mut last_id: Option<String> = None;
    let mut retries = 0;
    loop {
        let mut req = http
            .get(&url)
            .bearer_auth(&api.token)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(last) = &last_id {
            req = req.header("last-event-id", last);
        }
        let (problem, wait) = match req.send().await {
            Ok(resp) if resp.status() == reqwest::StatusCode::NO_CONTENT => return Ok(None),
            Ok(resp) if resp.status().is_success() => {
                let mut events = 0;
                let outcome = read_stream(resp, &mut last_id, reporter, &mut events).await;
                if events > 0 {
                    retries = 0;
                }
                match outcome {
                    Ok(Some(done)) => return Ok(Some(done)),
                    Ok(None) => ("the event stream ended before `done`".to_string(), None),
                    Err(e) => (e, None),
                }
            }
            Ok(resp) if retryable(resp.status()) => {
                let wait = retry_after(&resp);
                let status = resp.status();
                (
                    format!("{status}: {}", resp.text().await.unwrap_or_default()),
                    wait,
                )
            }
            Ok(resp) => {
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                return Err(failed(format!("{status}: {text}")));
            }
            Err(e) => (e.to_string(), None),
        };
        retries += 1;
        if retries > MAX_RETRIES {
            return Err(failed(format!(
                "gave up after {MAX_RETRIES} retries: {problem}"
            )));
        }
        let backoff = Duration::from_millis(250u64 << retries.min(4));
        tokio::time::sleep(wait.unwrap_or(backoff)).await;
    }
}

fn retryable(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// `Retry-After` in seconds, bounded so a hostile answer cannot park the CLI.
fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let secs: u64 = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs.clamp(1, 30)))
}

/// Reports each event of one connection; `Some(data)` of `done`, `None` when the stream
/// ended without it, `Err` when reading failed.
async fn read_stream(
    mut resp: reqwest::Response,
    last_id: &mut Option<String>,
    reporter: &mut Reporter,
    events: &mut usize,
) -> Result<Option<Value>, String> {
    let mut parser = SseParser::default();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        for event in parser.feed(&chunk).map_err(|e| e.to_string())? {
            if let Some(id) = event.id {
                *last_id = Some(id);
            }
            *events += 1;
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            if event.event == "done" {
                return Ok(Some(data));
            }
            reporter.event(&event.event, &data);
        }
    }
    Ok(None)
}

// ------------------------------------------------------------------------- reporting

/// Where progress goes: a spinner on a terminal, plain lines otherwise.
enum Reporter {
    Plain {
        id: String,
    },
    Live {
        id: String,
        bar: ProgressBar,
        /// The attempt under way: its text before the state.
        attempt: Option<String>,
        state: String,
    },
}

impl Reporter {
    fn new(id: &str) -> Reporter {
        let id = id.to_string();
        if !std::io::stderr().is_terminal() {
            return Reporter::Plain { id };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(100));
        bar.set_message(format!("sandbox {id}: creating"));
        Reporter::Live {
            id,
            bar,
            attempt: None,
            state: "pending".into(),
        }
    }

    fn event(&mut self, kind: &str, data: &Value) {
        match self {
            Reporter::Plain { id } => {
                if let Some(line) = plain_line(id, kind, data) {
                    eprintln!("{line}");
                }
            }
            Reporter::Live {
                id,
                bar,
                attempt,
                state,
            } => {
                match kind {
                    "state" => *state = text(&data["state"]),
                    "attempt_started" => *attempt = Some(started_text(data)),
                    "attempt_ended" => {
                        *attempt = None;
                        bar.println(ended_line(data));
                    }
                    _ => {}
                }
                bar.set_message(match attempt {
                    Some(a) => format!("{a}: {state}"),
                    None => format!("sandbox {id}: {state}"),
                });
            }
        }
    }

    /// Removes the spinner (before the final lines are printed).
    fn clear(&mut self) {
        if let Reporter::Live { bar, .. } = self {
            bar.finish_and_clear();
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => clean(s),
        Value::Null => "?".into(),
        other => clean(&other.to_string()),
    }
}

fn started_text(d: &Value) -> String {
    format!(
        "attempt {} on pool {} ({}/{})",
        text(&d["seq"]),
        text(&d["pool"]),
        text(&d["provider"]),
        text(&d["account"])
    )
}

/// `attempt 1 on pool sim-a: advance (provider_error) 123 ms: message`.
fn ended_line(d: &Value) -> String {
    let mut line = format!(
        "attempt {} on pool {}: {}",
        text(&d["seq"]),
        text(&d["pool"]),
        text(&d["outcome"])
    );
    if let Some(class) = d["error_class"].as_str() {
        line.push_str(&format!(" ({})", clean(class)));
    }
    if let Some(ms) = d["duration_ms"].as_i64() {
        line.push_str(&format!(" {ms} ms"));
    }
    if let Some(message) = d["message"].as_str() {
        line.push_str(&format!(": {}", clean(message)));
    }
    line
}

/// The plain line of one event (`done` is told by [`done_line`]).
fn plain_line(id: &str, kind: &str, d: &Value) -> Option<String> {
    match kind {
        "state" => Some(format!("sandbox {id}: {}", text(&d["state"]))),
        "attempt_started" => Some(format!("{}: started", started_text(d))),
        "attempt_ended" => Some(ended_line(d)),
        _ => None,
    }
}

/// `sandbox sb-1 is running on pool sim-c (sim/acct-c)`, or `sandbox sb-1 failed:
/// creation_failed: every candidate pool was tried ...`.
fn done_line(id: &str, done: &Value) -> String {
    let state = text(&done["state"]);
    if state == "running" {
        let p = &done["placement"];
        return format!(
            "sandbox {id} is running on pool {} ({}/{})",
            text(&p["pool"]),
            text(&p["provider"]),
            text(&p["account"])
        );
    }
    let error = &done["error"]["error"];
    match error["code"].as_str() {
        Some(code) => format!(
            "sandbox {id} failed: {}: {}",
            clean(code),
            text(&error["message"])
        ),
        None => format!("sandbox {id} failed: it ended in state {state}"),
    }
}

// ------------------------------------------------------------------------- SSE parsing

/// One server-sent event as a client dispatches it.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct SseEvent {
    /// The `event:` field; `message` when absent.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The `id:` field, when the event had one.
    pub id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("an event stream line is longer than {MAX_LINE_BYTES} bytes")]
pub(super) struct LineTooLong;

/// An incremental parser of `text/event-stream` (WHATWG HTML, "Server-sent events",
/// "Interpreting an event stream"): lines end in CRLF, LF or CR (also split across
/// chunks); a line starting with `:` is a comment; `field: value` loses one space after the
/// colon; `data` lines accumulate; a blank line dispatches the event unless it has no data;
/// an `id` containing NUL is ignored; `retry` and unknown fields are ignored.
///
/// Why not a crate (`eventsource-stream`): the format is this one paragraph of the spec,
/// and sandgate's own server is the producer; these lines with their tests are less to
/// audit and keep current than a dependency (and its parser-combinator dependency) for it,
/// and they bound the memory a misbehaving server can make the CLI hold.
#[derive(Debug, Default)]
pub(super) struct SseParser {
    line: Vec<u8>,
    /// The previous chunk ended in CR: an LF starting this one is part of that line end.
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
    id: Option<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, LineTooLong> {
        let mut out = Vec::new();
        for &b in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, b == b'\r');
            match b {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_done(&String::from_utf8_lossy(&line)) {
                        out.push(event);
                    }
                }
                _ if self.line.len() >= MAX_LINE_BYTES => return Err(LineTooLong),
                _ => self.line.push(b),
            }
        }
        Ok(out)
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        let id = self.id.take();
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(SseEvent {
            event: if event.is_empty() {
                "message".into()
            } else {
                event
            },
            data,
            id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        chunks.iter().flat_map(|c| p.feed(c).unwrap()).collect()
    }

    fn ev(event: &str, data: &str, id: Option<&str>) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: id.map(str::to_string),
        }
    }

    #[test]
    fn events_comments_and_keep_alives() {
        let stream = b": keep-alive\n\nevent: state\nid: 33\ndata: {\"state\":\"pending\"}\n\n:\n\nevent: done\ndata:x\n\n";
        assert_eq!(
            parse_all(&[stream]),
            [
                ev("state", "{\"state\":\"pending\"}", Some("33")),
                ev("done", "x", None)
            ]
        );
    }

    #[test]
    fn every_line_ending_and_any_split_between_chunks() {
        let text = "event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n";
        let want = [
            ev("a", "1", None),
            ev("b", "2", None),
            ev("message", "3", None),
        ];
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            assert_eq!(
                parse_all(&[&bytes[..cut], &bytes[cut..]]),
                want,
                "cut at {cut}"
            );
        }
        let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse_all(&one_by_one), want);
    }

    #[test]
    fn the_specs_field_rules() {
        // Multi-line data, one leading space removed, a field with no colon, NUL in an id,
        // an event with no data is not dispatched (its type does not leak into the next).
        let stream = b"data:  two spaces\ndata\ndata: end\n\nevent: nodata\nid: 1\n\nid: a\0b\ndata: x\n\nretry: 10\nunknown: y\ndata: z\n\n";
        assert_eq!(
            parse_all(&[stream]),
            [
                ev("message", " two spaces\n\nend", None),
                ev("message", "x", None),
                ev("message", "z", None),
            ]
        );
    }

    #[test]
    fn a_line_without_end_is_bounded() {
        let mut p = SseParser::default();
        let big = vec![b'a'; MAX_LINE_BYTES];
        assert!(p.feed(&big).unwrap().is_empty());
        assert!(p.feed(b"a").is_err());
        // Invalid UTF-8 is replaced, not an error.
        let mut p = SseParser::default();
        assert_eq!(p.feed(b"data: \xff\n\n").unwrap()[0].data, "\u{fffd}");
    }

    #[test]
    fn plain_lines_name_attempt_pool_outcome_class_duration_message() {
        let started = json!({"id": "sb-1-a1", "seq": 1, "pool": "sim-a", "provider": "sim", "account": "acct-1", "started_ms": 5});
        assert_eq!(
            plain_line("sb-1", "attempt_started", &started).unwrap(),
            "attempt 1 on pool sim-a (sim/acct-1): started"
        );
        let ended = json!({"seq": 1, "pool": "sim-a", "state": "advanced", "outcome": "advance", "error_class": "provider_error", "message": "boom", "duration_ms": 123});
        assert_eq!(
            plain_line("sb-1", "attempt_ended", &ended).unwrap(),
            "attempt 1 on pool sim-a: advance (provider_error) 123 ms: boom"
        );
        let ok = json!({"seq": 3, "pool": "sim-c", "outcome": "success", "error_class": null, "message": null, "duration_ms": 40});
        assert_eq!(ended_line(&ok), "attempt 3 on pool sim-c: success 40 ms");
        assert_eq!(
            plain_line(
                "sb-1",
                "state",
                &json!({"state": "provisioning", "at_ms": 1})
            )
            .unwrap(),
            "sandbox sb-1: provisioning"
        );
        assert_eq!(plain_line("sb-1", "bogus", &Value::Null), None);
        // Garbage data never panics.
        assert_eq!(ended_line(&Value::Null), "attempt ? on pool ?: ?");
    }

    #[test]
    fn terminal_escapes_from_a_provider_are_not_passed_through() {
        let ended =
            json!({"seq": 1, "pool": "p", "outcome": "advance", "message": "\u{1b}[2Jgone\r\n"});
        let line = ended_line(&ended);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("\\u{1b}[2Jgone"));
    }

    #[test]
    fn done_lines() {
        let running = json!({"state": "running", "error": null, "placement": {"pool": "sim-c", "provider": "sim", "account": "acct-c"}});
        assert_eq!(
            done_line("sb-1", &running),
            "sandbox sb-1 is running on pool sim-c (sim/acct-c)"
        );
        let failed = json!({"state": "failed", "error": {"error": {"code": "creation_failed", "message": "every candidate pool was tried"}}, "placement": null});
        assert_eq!(
            done_line("sb-1", &failed),
            "sandbox sb-1 failed: creation_failed: every candidate pool was tried"
        );
        assert_eq!(
            done_line("sb-1", &json!({"state": "deleted"})),
            "sandbox sb-1 failed: it ended in state deleted"
        );
    }

    #[test]
    fn the_sandbox_id_of_a_create_answer() {
        assert_eq!(sandbox_id(&json!({"id": "sb-1"})).as_deref(), Some("sb-1"));
        let failed = json!({"error": {"code": "creation_failed", "details": {"sandbox_id": "sb-2", "attempts": []}}});
        assert_eq!(sandbox_id(&failed).as_deref(), Some("sb-2"));
        let conflict =
            json!({"error": {"code": "idempotency_conflict", "details": {"sandbox_id": "sb-3"}}});
        assert_eq!(sandbox_id(&conflict), None);
        assert_eq!(
            sandbox_id(&json!({"error": {"code": "invalid_request"}})),
            None
        );
        assert_eq!(sandbox_id(&json!("text")), None);
    }

    #[test]
    fn the_token_of_the_create_answer_is_kept() {
        let created = json!({"egress": {"token": "t0k", "proxy_url": "http://sb:t0k@p", "token_already_shown": false}});
        let mut current = json!({"egress": {"proxy_url": "http://sb:{token}@p", "identity": "sb"}});
        keep_token(&mut current, &created);
        assert_eq!(current["egress"]["token"], "t0k");
        assert_eq!(current["egress"]["proxy_url"], "http://sb:t0k@p");
        assert_eq!(current["egress"]["identity"], "sb");
        // A body without an egress object is left as it is.
        let mut odd = json!({"egress": "x"});
        keep_token(&mut odd, &created);
        assert_eq!(odd, json!({"egress": "x"}));
    }
}
