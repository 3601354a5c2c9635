//! The table of each kind of answer: which columns, in which order, and what `-q` prints.
//! Columns are part of the CLI's contract (scripts read them with `awk`): add new ones at
//! the end, never reorder.

use serde_json::Value;

use super::output::{age, cell, list_of, now_ms, pairs, single, Shape};

/// One sandbox (`get`, `create`, `delete`, lifecycle operations).
pub(super) const SANDBOX: Shape = Shape {
    header: &["ID", "STATE", "POOL", "AGE", "LABELS"],
    wide: &["WORKSPACE", "PROVIDER", "ACCOUNT", "INSTANCE"],
    items: single,
    row: sandbox_row,
    id,
};

/// `sandbox list`.
pub(super) const SANDBOX_LIST: Shape = Shape {
    items: sandboxes,
    ..SANDBOX
};

/// `sandbox snapshot`: `{snapshot: {...}, export?}`.
pub(super) const SNAPSHOT: Shape = Shape {
    header: &["SNAPSHOT", "KIND", "SANDBOX", "POOL", "SIZE"],
    wide: &["WORKSPACE", "PROVIDER"],
    items: snapshot,
    row: snapshot_row,
    id,
};

/// `sandbox port`: `{url, host, port, public, token, token_header}`. `-q` prints the URL.
pub(super) const PORT: Shape = Shape {
    header: &["URL", "PUBLIC", "TOKEN"],
    wide: &["HEADER"],
    items: single,
    row: |p, wide| {
        let mut cells = vec![cell(&p["url"]), cell(&p["public"]), cell(&p["token"])];
        if wide {
            cells.push(cell(&p["token_header"]));
        }
        cells
    },
    id: |p| cell(&p["url"]),
};

/// An answer with no table (a dry-run plan): JSON even with `-o table`.
pub(super) const DOCUMENT: Shape = Shape {
    header: &[],
    wide: &[],
    items: single,
    row: |_, _| vec![],
    id,
};

/// `sandbox files ls`: `{path, entries: [...]}`.
pub(super) const FILES: Shape = Shape {
    header: &["MODE", "SIZE", "MODIFIED", "NAME"],
    wide: &["KIND"],
    items: entries,
    row: file_row,
    id: |e| cell(&e["name"]),
};

fn id(v: &Value) -> String {
    cell(&v["id"])
}

fn sandboxes(body: &Value) -> Vec<&Value> {
    list_of(body, "sandboxes")
}

fn entries(body: &Value) -> Vec<&Value> {
    list_of(body, "entries")
}

fn snapshot(body: &Value) -> Vec<&Value> {
    vec![&body["snapshot"]]
}

fn sandbox_row(s: &Value, wide: bool) -> Vec<String> {
    let placement = &s["placement"];
    let mut row = vec![
        id(s),
        cell(&s["state"]),
        cell(&placement["pool"]),
        age(s["created_ms"].as_i64(), now_ms()),
        pairs(&s["labels"]),
    ];
    if wide {
        row.extend([
            cell(&s["workspace"]),
            cell(&placement["provider"]),
            cell(&placement["account"]),
            cell(&placement["instance_id"]),
        ]);
    }
    row
}

fn snapshot_row(s: &Value, wide: bool) -> Vec<String> {
    let mut row = vec![
        id(s),
        cell(&s["kind"]),
        cell(&s["sandbox_id"]),
        cell(&s["pool"]),
        s["size_bytes"]
            .as_u64()
            .map(bytes)
            .unwrap_or_else(|| "-".into()),
    ];
    if wide {
        row.extend([cell(&s["workspace"]), cell(&s["provider"])]);
    }
    row
}

fn file_row(e: &Value, wide: bool) -> Vec<String> {
    let kind = e["kind"].as_str().unwrap_or("other");
    let mode = e["mode"].as_u64().unwrap_or(0) as u32;
    let mut row = vec![
        mode_string(kind, mode),
        e["size"]
            .as_u64()
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into()),
        modified(e["modified_unix"].as_i64()),
        cell(&e["name"]),
    ];
    if wide {
        row.push(kind.to_string());
    }
    row
}

/// `ls -l`'s mode column: the kind (`d`, `l`, `-`, `?`), then owner, group and other
/// permissions, with set-uid, set-gid and sticky bits as `s`/`S` and `t`/`T`.
pub(super) fn mode_string(kind: &str, mode: u32) -> String {
    let mut out = String::with_capacity(10);
    out.push(match kind {
        "dir" => 'd',
        "symlink" => 'l',
        "file" => '-',
        _ => '?',
    });
    let special = [(0o4000, 's'), (0o2000, 's'), (0o1000, 't')];
    for (i, (bit, letter)) in special.iter().enumerate() {
        let shift = 6 - 3 * i as u32;
        let rwx = (mode >> shift) & 0o7;
        out.push(if rwx & 4 != 0 { 'r' } else { '-' });
        out.push(if rwx & 2 != 0 { 'w' } else { '-' });
        out.push(match (rwx & 1 != 0, mode & bit != 0) {
            (true, true) => *letter,
            (false, true) => letter.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    out
}

/// A modification time as `2026-12-06 21:30` (UTC).
fn modified(unix: Option<i64>) -> String {
    let Some(t) = unix.and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok()) else {
        return "-".into();
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// A size in bytes as `512B`, `1.5KiB`, `20MiB`.
pub(super) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1}{}", UNITS[unit])
    } else {
        format!("{value:.0}{}", UNITS[unit])
    }
}

#[cfg(test)]
#[path = "shapes_tests.rs"]
mod tests;
