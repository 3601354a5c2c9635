//! Daytona commands: the toolbox's `POST /process/execute`, which does not stream (the
//! whole output arrives when the command ends), and its kill through a second execute.
//!
//! Contract: the argv is quoted for a POSIX shell ([`quote_argv`]); the command records its
//! shell's pid in a marker file so a cancel (or dropping the stream) can kill its process
//! group; a timeout the daemon reports (408) is `TimedOut`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use reqwest::Method;
use serde_json::json;
use tokio::sync::{mpsc, Notify};

use super::wire::ExecuteAnswer;
use super::{Daytona, MAX_EXEC_SECS};
use crate::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason};
use crate::providers::hosted::shell::quote_argv;
use crate::providers::{OpError, OpErrorKind};

impl Daytona {
    /// A second execute that kills the process group whose leader's pid is in `marker`
    /// (waiting up to 2 s for the command to have written it).
    fn kill_request(&self, url: &str, marker: &str) -> reqwest::RequestBuilder {
        let script = format!(
            "for i in 1 2 3 4 5 6 7 8 9 10; do [ -s {marker} ] && break; sleep 0.2; done; \
             kill -KILL -\"$(cat {marker})\" 2>/dev/null; rm -f {marker}"
        );
        self.with_org(self.http.request_url(Method::POST, url))
            .timeout(Duration::from_secs(30))
            .json(&json!({"command": script, "timeout": 10}))
    }

    /// `process/execute` in the background: one stdout event with the whole output, then
    /// the exit.
    pub(super) async fn start_exec(&self, id: &str, spec: ExecSpec) -> Result<ExecStream, OpError> {
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "argv must name a program",
            ));
        }
        let base = self.toolbox_base(id).await?;
        let url = format!("{base}/process/execute");
        let marker = format!("/tmp/.sandgate-exec-{}", crate::base::ids::random_hex(8));
        let command = format!(
            "{{ echo $$ > {marker}; }} 2>/dev/null; trap 'rm -f {marker}' EXIT\n{}\n",
            quote_argv(&spec.argv)
        );
        let timeout_secs = spec
            .timeout
            .map(|t| t.as_secs_f64().ceil().max(1.0) as u64)
            .unwrap_or(MAX_EXEC_SECS);
        let mut body = json!({"command": command, "envs": spec.env, "timeout": timeout_secs});
        if let Some(cwd) = &spec.cwd {
            body["cwd"] = json!(cwd);
        }
        let request = self
            .with_org(self.http.request_url(Method::POST, &url))
            .timeout(Duration::from_secs(timeout_secs) + Duration::from_secs(30))
            .json(&body);
        let kill = {
            let kill_request = self.kill_request(&url, &marker);
            let http = self.http.clone();
            let id = id.to_string();
            move || async move {
                if let Err(e) = http.send(kill_request).await {
                    tracing::warn!(sandbox_instance = %id, error = %e.message, "daytona: killing a cancelled command failed");
                }
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let cancelled = Arc::new(Notify::new());
        let notify = cancelled.clone();
        let http = self.http.clone();
        tokio::spawn(async move {
            tokio::select! {
                result = http.send(request) => {
                    let events = match result {
                        Ok(response) => match http.json::<ExecuteAnswer>(response).await {
                            Ok(answer) => exec_events(answer),
                            Err(f) => failed_exec(&f.message),
                        },
                        Err(f) if f.status == Some(StatusCode::REQUEST_TIMEOUT) => vec![ExecEvent::Exit(ExitInfo {
                            code: None,
                            signal: Some(9),
                            reason: ExitReason::TimedOut,
                        })],
                        Err(f) => failed_exec(&f.message),
                    };
                    for event in events {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                }
                _ = notify.notified() => {
                    kill().await;
                    let _ = tx.send(ExecEvent::Exit(ExitInfo {
                        code: None,
                        signal: Some(9),
                        reason: ExitReason::Cancelled,
                    })).await;
                }
                _ = tx.closed() => kill().await,
            }
        });
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || cancelled.notify_one());
        Ok(ExecStream { events: rx, cancel })
    }
}

fn exec_events(answer: ExecuteAnswer) -> Vec<ExecEvent> {
    let mut events = Vec::new();
    let output = answer.result.unwrap_or_default();
    if !output.is_empty() {
        events.push(ExecEvent::Stdout(Bytes::from(output)));
    }
    // The daemon answers -1 when the command could not start or was killed by a signal.
    let code = answer.exit_code.or(answer.code).filter(|c| *c >= 0);
    events.push(ExecEvent::Exit(ExitInfo {
        code: code.map(|c| c as i32),
        signal: None,
        reason: ExitReason::Exited,
    }));
    events
}

fn failed_exec(message: &str) -> Vec<ExecEvent> {
    vec![
        ExecEvent::Stderr(Bytes::from(format!("sandgate: {message}\n"))),
        ExecEvent::Exit(ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::Exited,
        }),
    ]
}
