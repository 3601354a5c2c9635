//! The response to the caller: the created sandbox (201), one still being placed (202), or
//! the failure the create ended in, in the shared error shape.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::{internal, Coordinator};
use crate::error::ErrorReply;

impl Coordinator {
    /// Waits (up to `within`) for a create still being placed to settle, then answers as a
    /// create would: the sandbox, or the refusal it ended in. For front ends whose protocol
    /// has no "accepted, still placing" answer (the E2B facade). Its status is 202 when the
    /// wait ran out first.
    pub async fn settle(
        &self,
        id: &str,
        within: Duration,
    ) -> Result<(StatusCode, Value), ErrorReply> {
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
                let (_, view) = self.respond(id, None).await?;
                return Ok((StatusCode::ACCEPTED, view));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The create response: 201 when running, 202 while working, the failure otherwise.
    /// `token` is the egress token, given only by the create that made the sandbox: the
    /// response then shows it (`egress.token`, and in `egress.proxy_url` and the proxy
    /// variables unless the sandbox's proxy is inside it) with `egress.token_already_shown:
    /// false`. Without it (a replay) the egress block is the one `GET` shows, the token's
    /// place marked `{token}`, with `token_already_shown: true`: a token shown twice is a
    /// token that can leak twice, from a retrying client's logs or a shared key.
    pub(super) async fn respond(
        &self,
        id: &str,
        token: Option<&str>,
    ) -> Result<(StatusCode, Value), ErrorReply> {
        let view = self
            .view(id)
            .await?
            .ok_or_else(|| internal("sandbox vanished"))?;
        let state = view["state"].as_str().unwrap_or_default().to_string();
        if state == "failed" {
            let error = view["error"].clone();
            let code = error["error"]["code"].as_str().unwrap_or("creation_failed");
            let status = match code {
                "forbidden" | "policy_denied" | "billing_refused" => StatusCode::FORBIDDEN,
                "invalid_request" => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let mut reply = ErrorReply::new(
                status,
                static_code(code),
                error["error"]["message"]
                    .as_str()
                    .unwrap_or("sandbox creation failed")
                    .to_string(),
            );
            let mut details = error["error"]["details"].clone();
            if !details.is_object() {
                details = json!({});
            }
            details["sandbox_id"] = json!(id);
            details["attempts"] = view["attempts"].clone();
            reply = reply.with_details(details);
            return Err(reply);
        }
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
        let status = if state == "running" {
            StatusCode::CREATED
        } else {
            StatusCode::ACCEPTED
        };
        Ok((status, body))
    }
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
