//! The decision log: one JSON line per egress decision, written off the request path by a
//! background task so a slow disk never stalls a proxied request. Records carry no header
//! values and no query values (those are where tokens travel), only their keys.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use tokio::sync::mpsc;

#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
    pub ts: String,
    pub kind: &'static str,
    pub sandbox: Option<String>,
    pub workspace: Option<String>,
    pub phase: &'static str,
    pub protocol: &'static str,
    pub host: String,
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub decision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    pub reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Names of the credentials applied to the request (never their values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    pub policy_generation: u64,
    pub latency_us: u64,
}

#[derive(Debug, Clone)]
pub enum Sink {
    Stdout,
    Stderr,
    Off,
    File(PathBuf),
}

impl Sink {
    pub fn parse(spec: &str) -> Sink {
        match spec {
            "stdout" => Sink::Stdout,
            "stderr" => Sink::Stderr,
            "off" => Sink::Off,
            path => Sink::File(PathBuf::from(path)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct DecisionLog {
    tx: Option<mpsc::Sender<DecisionRecord>>,
}

impl DecisionLog {
    /// Starts the writer. Records are dropped (and counted) rather than blocking when the
    /// writer falls 64k records behind.
    pub fn start(sink: Sink) -> std::io::Result<DecisionLog> {
        let mut out: Box<dyn Write + Send> = match &sink {
            Sink::Off => return Ok(DecisionLog { tx: None }),
            Sink::Stdout => Box::new(std::io::stdout()),
            Sink::Stderr => Box::new(std::io::stderr()),
            Sink::File(path) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                Box::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)?,
                )
            }
        };
        let (tx, mut rx) = mpsc::channel::<DecisionRecord>(65_536);
        std::thread::Builder::new()
            .name("sandgate-decision-log".into())
            .spawn(move || {
                while let Some(record) = rx.blocking_recv() {
                    let mut line = serde_json::to_vec(&record).unwrap_or_default();
                    line.push(b'\n');
                    // Drain what is already queued before flushing: one write per burst.
                    while let Ok(next) = rx.try_recv() {
                        if let Ok(more) = serde_json::to_vec(&next) {
                            line.extend_from_slice(&more);
                            line.push(b'\n');
                        }
                    }
                    if out.write_all(&line).and_then(|_| out.flush()).is_err() {
                        metrics::counter!("sandgate_decision_log_write_errors_total").increment(1);
                    }
                }
            })?;
        Ok(DecisionLog { tx: Some(tx) })
    }

    /// Whether records are written at all; callers skip building one when not.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    pub fn record(&self, record: DecisionRecord) {
        if let Some(tx) = &self.tx {
            if tx.try_send(record).is_err() {
                metrics::counter!("sandgate_decision_log_dropped_total").increment(1);
            }
        }
    }
}

/// `/path?a=1&b=x` → `/path?a=&b=`: keys stay (useful to read), values go (they carry tokens).
pub fn redact_query(path_and_query: &str) -> String {
    match path_and_query.split_once('?') {
        None => path_and_query.to_string(),
        Some((path, query)) => {
            let keys: Vec<&str> = query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|pair| pair.split_once('=').map(|(k, _)| k).unwrap_or(pair))
                .collect();
            let mut out = String::from(path);
            out.push('?');
            out.push_str(
                &keys
                    .iter()
                    .map(|k| format!("{k}="))
                    .collect::<Vec<_>>()
                    .join("&"),
            );
            out
        }
    }
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_removed() {
        assert_eq!(
            redact_query("/a/b?token=s3cret&x=1&flag"),
            "/a/b?token=&x=&flag="
        );
        assert_eq!(redact_query("/plain"), "/plain");
    }
}
