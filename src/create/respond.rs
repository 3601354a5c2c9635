//! The response to the caller: the created sandbox, one still being placed, or the failure
//! the create ended in, as a domain error.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::view::attempt_record;
use super::{internal, Coordinator};
use crate::error::{AttemptRecord, Attempts, Error, Kind, Record};

/// What a create answers with, besides a failure: the front end picks its status (`/v1`
/// answers 201, 202 and 200).
#[derive(Debug)]
pub enum Answer {
    /// The sandbox is running.
    Placed(Value),
    /// Still being placed (or reconciled): the same view, with its state.
    Placing(Value),
    /// A dry run's plan; nothing was created.
    Plan(Value),
}

impl Answer {
    pub fn body(&self) -> &Value {
        match self {
            Answer::Placed(v) | Answer::Placing(v) | Answer::Plan(v) => v,
        }
    }

    pub fn into_body(self) -> Value {
        match self {
            Answer::Placed(v) | Answer::Placing(v) | Answer::Plan(v) => v,
        }
    }
}

impl Coordinator {
    /// Waits (up to `within`) for a create still being placed to settle, then answers as a
    /// create would: the sandbox, or the refusal it ended in. For front ends whose protocol
    /// has no "accepted, still placing" answer (the E2B facade). It is
    /// [`Answer::Placing`] when the wait ran out first.
    pub async fn settle(&self, id: &str, within: Duration) -> Result<Answer, Error> {
        let deadline = Instant::now() + within;
        loop {
            let row = self.deps.store.get_sandbox(id).await.map_err(internal)?;
            let placing = row.as_ref().is_some_and(|r| {
                matches!(r.state.as_str(), "pending" | "provisioning" | "reconciling")
            });
            if !placing {
                return self.respond(id, None).await;
            }
            if Instant::now() >= deadline {
                let view = self.respond(id, None).await?.into_body();
                return Ok(Answer::Placing(view));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The create response: placed when running, placing while working, the failure
    /// otherwise.
    /// `token` is the egress token, given only by the create that made the sandbox: the
    /// response then shows it (`egress.token`, and in `egress.proxy_url` and the proxy
    /// variables unless the sandbox's proxy is inside it) with `egress.token_already_shown:
    /// false`. Without it (a replay) the egress block is the one `GET` shows, the token's
    /// place marked `{token}`, with `token_already_shown: true`: a token shown twice is a
    /// token that can leak twice, from a retrying client's logs or a shared key.
    pub(super) async fn respond(&self, id: &str, token: Option<&str>) -> Result<Answer, Error> {
        let row = self.deps.store.get_sandbox(id).await.map_err(internal)?;
        let row = row.ok_or_else(|| internal("sandbox vanished"))?;
        if row.state == "failed" {
            let record = row.error_json.as_deref().and_then(Record::from_stored);
            let attempts = self.deps.store.list_attempts(id).await.map_err(internal)?;
            let attempts = attempts.iter().map(attempt_record).collect();
            return Err(failed_create(id, record.unwrap_or_default(), attempts));
        }
        let view = self
            .view(id)
            .await?
            .ok_or_else(|| internal("sandbox vanished"))?;
        let state = view["state"].as_str().unwrap_or_default().to_string();
        let mut body = view;
        body["egress"]["token_already_shown"] = json!(token.is_none());
        if let Some(token) = token {
            // A local sandbox's proxy is inside it and needs no credentials.
            let endpoint = self.endpoint(body["placement"]["pool"].as_str(), id);
            let egress = &mut body["egress"];
            egress["token"] = json!(token);
            if endpoint.takes_token() {
                let url = endpoint.url_with(token);
                egress["proxy_url"] = json!(url);
                if let Some(env) = egress["env"].as_object_mut() {
                    for var in crate::localbox::PROXY_ENV_VARS {
                        env.insert(var.into(), json!(url));
                    }
                }
            }
        }
        Ok(if state == "running" {
            Answer::Placed(body)
        } else {
            Answer::Placing(body)
        })
    }
}

/// The error a create that ended in `failed` answers with: its stored code (one of the
/// codes a create ends with; any other answers `creation_failed`), message and details, with
/// the sandbox's id and its attempts as the sandbox shows them. A refusal is 403, a
/// provider's rejection of the request itself 422, anything else 503.
fn failed_create(id: &str, record: Record, attempts: Vec<AttemptRecord>) -> Error {
    let code = static_code(&record.code);
    let kind = match code {
        "forbidden" | "policy_denied" | "billing_refused" => Kind::Refused,
        "invalid_request" => Kind::Unprocessable,
        _ => Kind::Unavailable,
    };
    let message = if record.message.is_empty() {
        "sandbox creation failed".to_string()
    } else {
        record.message
    };
    let mut details = record.details;
    details.sandbox_id = Some(id.to_string());
    details.attempts = Some(Attempts::Recorded(attempts));
    Error::new(kind, code, message).with_details(details)
}

fn static_code(code: &str) -> &'static str {
    match code {
        "forbidden" => "forbidden",
        "policy_denied" => "policy_denied",
        "billing_refused" => "billing_refused",
        "invalid_request" => "invalid_request",
        "no_eligible_provider" => "no_eligible_provider",
        _ => "creation_failed",
    }
}
