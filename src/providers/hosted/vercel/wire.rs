//! Vercel's JSON (sandboxes, sessions, listings), read leniently, what a sandbox's status
//! means to sandgate, and the gzip tar `fs/write` takes (one file, named as the SDK's
//! `normalizePath` names it).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::providers::hosted::tags::tags_of;
use crate::providers::{Instance, InstanceState, OpError, OpErrorKind};

/// `path` made absolute (relative to `/vercel/sandbox`) and normalized, as the SDK's
/// `normalizePath` does; returned relative to `/` for a tar entry.
pub(super) fn tar_name(path: &str) -> Result<String, OpError> {
    let full = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/vercel/sandbox/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in full.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(OpError::new(
            OpErrorKind::Invalid,
            "a file path must name a file",
        ));
    }
    Ok(parts.join("/"))
}

/// One file as the gzip tar `fs/write` takes.
pub(super) fn tar_gz(path: &str, data: &[u8]) -> Result<Vec<u8>, OpError> {
    let name = tar_name(path)?;
    let invalid = |e: std::io::Error| OpError::new(OpErrorKind::Invalid, format!("{path}: {e}"));
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut builder = tar::Builder::new(gz);
    let mut header = tar::Header::new_ustar();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    );
    builder
        .append_data(&mut header, &name, data)
        .map_err(invalid)?;
    let gz = builder.into_inner().map_err(invalid)?;
    gz.finish().map_err(invalid)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxBody {
    pub(super) name: String,
    #[serde(default)]
    pub(super) current_session_id: String,
    #[serde(default)]
    pub(super) status: String,
    #[serde(default)]
    pub(super) tags: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct SessionBody {
    pub(super) id: String,
    #[serde(default)]
    pub(super) status: String,
    /// The session's whole timeout, in milliseconds from `startedAt` (or `createdAt`).
    #[serde(default)]
    pub(super) timeout: Option<u64>,
    #[serde(default, rename = "startedAt")]
    pub(super) started_at: Option<i64>,
    #[serde(default, rename = "createdAt")]
    pub(super) created_at: Option<i64>,
}

impl SessionBody {
    /// When Vercel stops the session, in Unix milliseconds.
    pub(super) fn deadline_ms(&self) -> Option<i64> {
        let start = self.started_at.or(self.created_at)?;
        Some(start + i64::try_from(self.timeout?).ok()?)
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct SandboxAndSession {
    pub(super) sandbox: SandboxBody,
    #[serde(default)]
    pub(super) session: Option<SessionBody>,
}

#[derive(Debug, Deserialize)]
pub(super) struct SessionOnly {
    pub(super) session: SessionBody,
}

#[derive(Debug, Deserialize)]
pub(super) struct ListBody {
    pub(super) sandboxes: Vec<SandboxBody>,
    #[serde(default)]
    pub(super) pagination: Option<Pagination>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Pagination {
    #[serde(default)]
    pub(super) next: Option<String>,
}

/// A sandbox's status as an instance state: a stopped sandbox is not adopted.
pub(super) fn state_of(status: &str) -> InstanceState {
    match status {
        "pending" => InstanceState::Starting,
        "running" | "snapshotting" => InstanceState::Running,
        _ => InstanceState::Failed,
    }
}

pub(super) fn instance(sandbox: &SandboxBody) -> Instance {
    Instance {
        id: sandbox.name.clone(),
        tags: tags_of(Some(&sandbox.tags)),
        state: state_of(&sandbox.status),
    }
}
