//! Reading sandboxes: the view `GET` shows and the rows of list pages (never the token; the
//! values of `env` sealed).

use serde_json::{json, Value};

use super::{internal, record, Coordinator};
use crate::error::{AttemptRecord, Error};
use crate::store::sandboxes::{AttemptRow, ListFilter, SandboxRow};

impl Coordinator {
    /// The sandbox as `GET` shows it: never the token.
    pub async fn view(&self, id: &str) -> Result<Option<Value>, Error> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        let attempts = self.deps.store.list_attempts(id).await.map_err(internal)?;
        let mut view = self.render(&row, &attempts);
        view["placement_record"] = record::stored(row.placement_record_json.as_deref());
        Ok(Some(view))
    }

    /// A sandbox as listed; [`Coordinator::view`] adds its placement record (kept out of
    /// list pages: it explains every pool, and a page holds up to a hundred sandboxes).
    pub(super) fn render(&self, row: &SandboxRow, attempts: &[AttemptRow]) -> Value {
        let mut request: Value = serde_json::from_str(&row.request_json).unwrap_or(Value::Null);
        if let Some(o) = request.as_object_mut() {
            // Values of `env` are sealed and never shown; their names are.
            o.remove("env_sealed");
            if let Some(Value::Object(env)) = o.get_mut("env") {
                for value in env.values_mut() {
                    *value = json!("(sealed)");
                }
            }
        }
        let labels: Value = serde_json::from_str(&row.labels_json).unwrap_or(json!({}));
        let placement: Value = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or(Value::Null);
        let error: Value = row
            .error_json
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or(Value::Null);
        let attempts: Vec<AttemptRecord> = attempts.iter().map(attempt_record).collect();
        let endpoint = self.endpoint(placement["pool"].as_str(), &row.id);
        let (proxy_base, proxy, ca) = (
            endpoint.base.clone(),
            endpoint.url_template.clone(),
            endpoint.ca_path.clone(),
        );
        let mut env = serde_json::Map::new();
        for var in crate::localbox::PROXY_ENV_VARS {
            env.insert(var.into(), json!(proxy));
        }
        env.insert("NO_PROXY".into(), json!(crate::localbox::NO_PROXY));
        env.insert("no_proxy".into(), json!(crate::localbox::NO_PROXY));
        for var in crate::localbox::CA_ENV_VARS {
            env.insert(var.to_string(), json!(ca));
        }
        json!({
            "id": row.id,
            "workspace": row.workspace,
            "state": row.state,
            "labels": labels,
            "request": request,
            "placement": placement,
            "attempts": attempts,
            "error": error,
            "created_ms": row.created_ms,
            "updated_ms": row.updated_ms,
            "expires_ms": row.expires_ms,
            "egress": {
                "identity": row.id,
                "enforcement": endpoint.enforcement,
                "proxy": proxy_base,
                "proxy_url": proxy,
                "ca_cert_path": ca,
                "env": env,
            },
        })
    }

    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Value>, Error> {
        let rows = self
            .deps
            .store
            .list_sandboxes(filter)
            .await
            .map_err(internal)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let attempts = self
                .deps
                .store
                .list_attempts(&row.id)
                .await
                .map_err(internal)?;
            out.push(self.render(&row, &attempts));
        }
        Ok(out)
    }
}

/// One attempt as the API shows it (the view's `attempts`, a failed create's
/// `details.attempts`).
pub(super) fn attempt_record(a: &AttemptRow) -> AttemptRecord {
    AttemptRecord {
        id: a.id.clone(),
        seq: a.seq,
        pool: a.pool.clone(),
        provider: a.provider.clone(),
        account: a.account.clone(),
        state: a.state.clone(),
        outcome: a.outcome.clone(),
        error_class: a.error_class.clone(),
        message: a.message.clone(),
        instance_id: a.instance_id.clone(),
        started_ms: a.started_ms,
        finished_ms: a.finished_ms,
        duration_ms: a.finished_ms.map(|f| f - a.started_ms),
        retries: a
            .retries_json
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok())
            .unwrap_or_default(),
    }
}
