//! Daytona's JSON: the sandbox, listing, execute, file and snapshot bodies the API and the
//! toolbox answer, read leniently (every field but the id may be missing), and what they
//! mean to sandgate (instance states, directory entries, provisioned resources).

use std::collections::BTreeMap;

use sandgate_router::Resources;
use serde::Deserialize;

use crate::ops::SandboxEntry;
use crate::providers::hosted::tags::tags_of;
use crate::providers::{Instance, InstanceState};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxDto {
    pub(super) id: String,
    #[serde(default)]
    pub(super) state: Option<String>,
    #[serde(default)]
    pub(super) labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(super) error_reason: Option<String>,
    #[serde(default)]
    pub(super) toolbox_proxy_url: Option<String>,
    #[serde(default)]
    pub(super) network_block_all: Option<bool>,
    #[serde(default)]
    pub(super) network_allow_list: Option<String>,
    #[serde(default)]
    pub(super) cpu: Option<f64>,
    /// GiB.
    #[serde(default)]
    pub(super) memory: Option<f64>,
    /// GiB.
    #[serde(default)]
    pub(super) disk: Option<f64>,
    #[serde(default)]
    pub(super) gpu: Option<f64>,
    #[serde(default)]
    pub(super) sandbox_class: Option<String>,
}

impl SandboxDto {
    pub(super) fn instance(&self) -> Instance {
        let state = match self.state.as_deref().unwrap_or("") {
            "error" | "build_failed" => InstanceState::Failed,
            "creating" | "restoring" | "starting" | "pending_build" | "building_snapshot"
            | "pulling_snapshot" | "unknown" | "" => InstanceState::Starting,
            // Started, stopped, paused, archived, ...: the sandbox exists and holds capacity.
            _ => InstanceState::Running,
        };
        Instance {
            id: self.id.clone(),
            tags: tags_of(self.labels.as_ref()),
            state,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ListAnswer {
    #[serde(rename_all = "camelCase")]
    Page {
        items: Vec<SandboxDto>,
        #[serde(default)]
        next_cursor: Option<String>,
    },
    Bare(Vec<SandboxDto>),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ExecuteAnswer {
    #[serde(default)]
    pub(super) exit_code: Option<i64>,
    /// Some daemons name it `code`.
    #[serde(default)]
    pub(super) code: Option<i64>,
    #[serde(default)]
    pub(super) result: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FileInfoDto {
    pub(super) name: String,
    #[serde(default)]
    pub(super) size: u64,
    #[serde(default)]
    pub(super) is_dir: bool,
    #[serde(default)]
    pub(super) mode: String,
    #[serde(default)]
    pub(super) permissions: String,
    #[serde(default)]
    pub(super) modified_at: Option<String>,
}

impl From<FileInfoDto> for SandboxEntry {
    fn from(f: FileInfoDto) -> SandboxEntry {
        // `mode` is Go's FileMode string (`drwxr-xr-x`, `Lrwxrwxrwx`, `-rw-r--r--`).
        let kind = if f.is_dir {
            "dir"
        } else {
            match f.mode.chars().next() {
                Some('L') => "symlink",
                Some('-') | None => "file",
                _ => "other",
            }
        };
        SandboxEntry {
            name: f.name,
            kind,
            size: f.size,
            mode: u32::from_str_radix(f.permissions.trim(), 8).unwrap_or(0) & 0o7777,
            modified_unix: f.modified_at.as_deref().and_then(rfc3339_unix).unwrap_or(0),
        }
    }
}

/// Seconds since the epoch of an RFC 3339 timestamp (`2026-06-25T13:16:13.5+02:00`).
pub(super) fn rfc3339_unix(text: &str) -> Option<i64> {
    let (date, rest) = text.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time_end = rest.find(['Z', 'z', '+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(time_end);
    let mut t = time.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let min: i64 = t.next()?.parse().ok()?;
    let sec: i64 = t.next().map_or(Some(0.0), |s| s.parse::<f64>().ok())? as i64;
    let offset = match zone.chars().next() {
        None | Some('Z' | 'z') => 0,
        Some(sign) => {
            let (oh, om) = zone[1..].split_once(':').unwrap_or((&zone[1..], "0"));
            let secs = oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60;
            if sign == '-' {
                -secs
            } else {
                secs
            }
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + sec - offset)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SnapshotDto {
    pub(super) id: String,
    #[serde(default)]
    pub(super) state: Option<String>,
    /// GB.
    #[serde(default)]
    pub(super) size: Option<f64>,
    #[serde(default)]
    pub(super) error_reason: Option<String>,
}

/// What Daytona provisioned below what the create asked for (Daytona reports GiB).
pub(super) fn resource_shortfall(requested: &Resources, dto: &SandboxDto) -> Vec<String> {
    let mut short = Vec::new();
    if let (Some(want), Some(has)) = (requested.cpu, dto.cpu) {
        if has + 1e-9 < want {
            short.push(format!("cpu {has} < {want}"));
        }
    }
    if let (Some(want), Some(has)) = (requested.memory_mb, dto.memory) {
        if has * 1024.0 + 1e-6 < want as f64 {
            short.push(format!("memory {} MiB < {want} MiB", (has * 1024.0) as u64));
        }
    }
    if let (Some(want), Some(has)) = (requested.disk_gb, dto.disk) {
        if has + 1e-9 < want as f64 {
            short.push(format!("disk {has} GB < {want} GB"));
        }
    }
    if let (Some(want), Some(has)) = (requested.gpu, dto.gpu) {
        if has + 1e-9 < f64::from(want) {
            short.push(format!("gpu {has} < {want}"));
        }
    }
    short
}
