//! Prime's JSON (sandboxes, listings, gateway auth), read leniently, what a sandbox's status
//! means to sandgate, and how sandgate's tags travel in Prime's `labels` (a list of strings).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::providers::hosted::tags::{tags_of, TagFilter};
use crate::providers::{Instance, InstanceState, Tags};

/// A sandbox as `GET /api/v1/sandbox/{id}` and the create answer it (camelCase on the wire).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxView {
    pub(super) id: String,
    pub(super) status: String,
    #[serde(default)]
    pub(super) labels: Vec<String>,
    #[serde(default)]
    pub(super) error_type: Option<String>,
    #[serde(default)]
    pub(super) error_message: Option<String>,
    #[serde(default)]
    pub(super) gateway_auth: Option<GatewayAuth>,
    #[serde(default)]
    pub(super) created_at: Option<String>,
    #[serde(default)]
    pub(super) timeout_minutes: Option<u64>,
}

impl SandboxView {
    /// How long until Prime ends the sandbox on its own clock (`createdAt` +
    /// `timeoutMinutes`), when the answer tells; `None` for no clock (0) or an unreadable one.
    pub(super) fn time_left(&self) -> Option<std::time::Duration> {
        let minutes = self.timeout_minutes.filter(|m| *m > 0)?;
        let rfc3339 = &time::format_description::well_known::Rfc3339;
        let created = time::OffsetDateTime::parse(self.created_at.as_deref()?, rfc3339).ok()?;
        let ends = created + time::Duration::minutes(i64::try_from(minutes).ok()?);
        Some(
            std::time::Duration::try_from(ends - time::OffsetDateTime::now_utc())
                .unwrap_or_default(),
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxList {
    #[serde(default)]
    pub(super) sandboxes: Vec<SandboxView>,
    #[serde(default)]
    pub(super) has_next: bool,
}

/// `POST /api/v1/sandbox/{id}/auth` (and a create's `gatewayAuth`): where the sandbox's
/// commands and files are served and the short-lived token for them (snake_case on the
/// wire, as the SDK reads it).
#[derive(Clone, Deserialize)]
pub(super) struct GatewayAuth {
    pub(super) gateway_url: String,
    pub(super) user_ns: String,
    pub(super) job_id: String,
    pub(super) token: String,
    #[serde(default)]
    pub(super) expires_at: Option<String>,
}

impl std::fmt::Debug for GatewayAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token never appears in a log or an error.
        f.debug_struct("GatewayAuth")
            .field("gateway_url", &self.gateway_url)
            .finish_non_exhaustive()
    }
}

impl GatewayAuth {
    /// `{gateway_url}/{user_ns}/{job_id}`: the sandbox's origin on the gateway.
    pub(super) fn base(&self) -> String {
        format!(
            "{}/{}/{}",
            self.gateway_url.trim_end_matches('/'),
            self.user_ns,
            self.job_id
        )
    }
}

/// A filesystem checkpoint (`/api/v1/sandbox/{id}/checkpoints`, snake_case on the wire).
#[derive(Debug, Deserialize)]
pub(super) struct CheckpointView {
    pub(super) id: String,
    pub(super) state: String,
    #[serde(default)]
    pub(super) stored_bytes: Option<u64>,
    #[serde(default)]
    pub(super) occupied_bytes: Option<u64>,
    #[serde(default)]
    pub(super) error: Option<String>,
}

/// Live states (everything but the three terminal ones).
pub(super) fn live(status: &str) -> bool {
    !matches!(status, "ERROR" | "TERMINATED" | "TIMEOUT")
}

pub(super) fn instance_of(view: &SandboxView) -> Instance {
    Instance {
        id: view.id.clone(),
        tags: tags_of(Some(&label_map(&view.labels))),
        state: match view.status.as_str() {
            // A paused sandbox exists and can resume: live.
            "RUNNING" | "PAUSED" => InstanceState::Running,
            "ERROR" | "TERMINATED" | "TIMEOUT" => InstanceState::Failed,
            _ => InstanceState::Starting,
        },
    }
}

/// One `key=value` label per tag: Prime's labels are plain strings, filtered by equality.
pub(super) fn tag_labels(tags: &Tags) -> Vec<String> {
    TagFilter::new(&tags.sandbox_id, Some(&tags.attempt_id))
        .pairs()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// The labels a listing asks for.
pub(super) fn filter_labels(filter: &TagFilter<'_>) -> Vec<String> {
    filter
        .pairs()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// `key=value` labels as a map (other labels are ignored).
pub(super) fn label_map(labels: &[String]) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
