//! Reading sandboxes: the view `GET` shows and the rows of list pages (never the token; the
//! values of `env` sealed).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

use super::{internal, record, Coordinator};
use crate::error::{AttemptRecord, Error};
use crate::store::sandboxes::{AttemptRow, ListFilter, SandboxRow};

/// A sandbox as the API shows it (`GET /v1/sandboxes/{id}`, list pages, lifecycle answers
/// and the create's answer). The view is built from this type, so the OpenAPI document's
/// schema is what the gateway serializes.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SandboxView {
    pub id: String,
    pub workspace: String,
    /// `pending`, `provisioning`, `reconciling`, `running`, `paused`, `stopped`, `failed`
    /// or `deleted`.
    pub state: String,
    pub labels: BTreeMap<String, String>,
    /// The create request as stored (the values of `env` shown as `(sealed)`).
    #[schema(value_type = Object)]
    pub request: Value,
    /// Where it runs: `{pool, provider, account, instance_id, ...}`; null until placed.
    #[schema(value_type = Option<Object>)]
    pub placement: Value,
    pub attempts: Vec<AttemptRecord>,
    /// The failure a failed create ended in (`{code, message, details}`); null otherwise.
    #[schema(value_type = Option<Object>)]
    pub error: Value,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub expires_ms: Option<i64>,
    pub egress: EgressView,
    /// How the create was placed (`GET` of one sandbox only; null for sandboxes created
    /// before records were kept; absent from list pages).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub placement_record: Option<Value>,
}

/// Where a sandbox's traffic goes and how it is checked.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EgressView {
    pub identity: String,
    /// `namespace`, `gateway`, `advisory` or `proxy_credentials`.
    pub enforcement: String,
    /// The proxy without credentials.
    pub proxy: String,
    /// The proxy URL; `{token}` marks where the token goes except on the answer to the
    /// create that made the sandbox.
    pub proxy_url: String,
    pub ca_cert_path: String,
    /// The proxy and CA variables a process in the sandbox uses.
    pub env: BTreeMap<String, String>,
    /// The egress token: only on the answer to the create that made the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// On create answers: false when this answer carries the token, true on a replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_already_shown: Option<bool>,
}

/// A page of `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SandboxPage {
    #[schema(value_type = Vec<SandboxView>)]
    pub sandboxes: Vec<Value>,
    /// Where the next page starts; null on the last page.
    pub next_cursor: Option<String>,
}

impl Coordinator {
    /// The sandbox as `GET` shows it: never the token.
    pub async fn view(&self, id: &str) -> Result<Option<Value>, Error> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        let attempts = self.deps.store.list_attempts(id).await.map_err(internal)?;
        let mut view = self.render(&row, &attempts);
        view["placement_record"] = record::stored(row.placement_record_json.as_deref());
        if let Some(limits) = self.limits_of(&view["placement"]) {
            view["limits"] = limits;
        }
        Ok(Some(view))
    }

    /// The `limit_reached` events of the sandbox's instance with a `seq` above `after`, in
    /// order (what its provider still holds: the latest 64); `None` once the sandbox is
    /// gone, deleted or failed, when no more can come.
    pub async fn limit_events(&self, id: &str, after: u64) -> Result<Option<Vec<Value>>, Error> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        if matches!(row.state.as_str(), "deleted" | "failed") {
            return Ok(None);
        }
        let placement: Value = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or(Value::Null);
        let events = self
            .limits_of(&placement)
            .and_then(|limits| limits["events"].as_array().cloned())
            .unwrap_or_default();
        Ok(Some(
            events
                .into_iter()
                .filter(|e| e["seq"].as_u64().is_some_and(|seq| seq > after))
                .collect(),
        ))
    }

    /// What the instance's provider reports of its limits, when it enforces them here.
    fn limits_of(&self, placement: &Value) -> Option<Value> {
        let pool = placement["pool"].as_str()?;
        let instance = placement["instance_id"].as_str()?;
        self.deps.providers.for_pool(pool)?.limits_view(instance)
    }

    /// A sandbox as listed; [`Coordinator::view`] adds its placement record (kept out of
    /// list pages: it explains every pool, and a page holds up to a hundred sandboxes).
    pub(super) fn render(&self, row: &SandboxRow, attempts: &[AttemptRow]) -> Value {
        serde_json::to_value(self.render_view(row, attempts)).unwrap_or(Value::Null)
    }

    /// [`Coordinator::render`]'s view, typed: the shape the OpenAPI document publishes.
    fn render_view(&self, row: &SandboxRow, attempts: &[AttemptRow]) -> SandboxView {
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
        let labels: BTreeMap<String, String> =
            serde_json::from_str(&row.labels_json).unwrap_or_default();
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
        let mut env = BTreeMap::new();
        for var in crate::localbox::PROXY_ENV_VARS {
            env.insert(var.to_string(), proxy.clone());
        }
        env.insert("NO_PROXY".into(), crate::localbox::NO_PROXY.to_string());
        env.insert("no_proxy".into(), crate::localbox::NO_PROXY.to_string());
        for var in crate::localbox::CA_ENV_VARS {
            env.insert(var.to_string(), ca.clone());
        }
        SandboxView {
            id: row.id.clone(),
            workspace: row.workspace.clone(),
            state: row.state.clone(),
            labels,
            request,
            placement,
            attempts,
            error,
            created_ms: row.created_ms,
            updated_ms: row.updated_ms,
            expires_ms: row.expires_ms,
            egress: EgressView {
                identity: row.id.clone(),
                enforcement: endpoint.enforcement.to_string(),
                proxy: proxy_base,
                proxy_url: proxy,
                ca_cert_path: ca,
                env,
                token: None,
                token_already_shown: None,
            },
            placement_record: None,
        }
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
