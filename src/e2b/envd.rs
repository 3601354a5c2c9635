//! envd's messages (`spec/envd/*.proto` of `e2b-dev/E2B`, proto3 JSON): `EntryInfo` of the
//! filesystem service and the events of `process.Process/Start` and `Connect`.
//!
//! proto3 JSON rules that matter here: 64-bit integers travel as strings (`size`), zero
//! values are omitted (an `exitCode` of 0 is absent), enums are their names
//! (`FILE_TYPE_FILE`), bytes are base64 (`stdout`), timestamps are RFC 3339.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::ops::{ExitInfo, ExitReason, FsEventKind, SandboxEntry};

/// envd's port, named in `E2b-Sandbox-Port` and in `{port}-{id}.{domain}` host names.
pub const ENVD_PORT: u16 = 49983;
/// The home of the sandbox's default user, from which envd resolves relative paths.
pub const HOME: &str = "/home/user";

/// An `EntryInfo` for `entry`, found in directory `dir` (a sandbox path).
pub fn entry_info(dir: &str, entry: &SandboxEntry) -> Value {
    let path = join(dir, &entry.name);
    let kind = match entry.kind {
        "dir" => "FILE_TYPE_DIRECTORY",
        "file" => "FILE_TYPE_FILE",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let mut out = json!({
        "name": entry.name,
        "type": kind,
        "path": path,
        "size": entry.size.to_string(),
        "mode": entry.mode & 0o7777,
        "permissions": permissions(entry),
        "owner": "user",
        "group": "user",
        "modifiedTime": rfc3339(entry.modified_unix),
    });
    if entry.kind == "symlink" {
        out["isSymlink"] = json!(true);
    }
    out
}

/// The `EntryInfo` of a directory known only by its path (`/`, or one just made).
pub fn dir_info(path: &str) -> Value {
    let name = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("/");
    json!({
        "name": name,
        "type": "FILE_TYPE_DIRECTORY",
        "path": path,
        "size": "0",
        "mode": 0o755,
        "permissions": "drwxr-xr-x",
        "owner": "user",
        "group": "user",
    })
}

/// A `SandboxEntry` from envd's `EntryInfo` (what sandgate's E2B adapter reads).
pub fn entry_from_info(value: &Value) -> SandboxEntry {
    let kind = match value["type"].as_str() {
        _ if value["isSymlink"] == true => "symlink",
        Some("FILE_TYPE_FILE") => "file",
        Some("FILE_TYPE_DIRECTORY") => "dir",
        _ => "other",
    };
    let size = value["size"]
        .as_u64()
        .or_else(|| value["size"].as_str()?.parse().ok())
        .unwrap_or(0);
    let modified_unix = value["modifiedTime"]
        .as_str()
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
        .map_or(0, |t| t.unix_timestamp());
    SandboxEntry {
        name: value["name"].as_str().unwrap_or_default().to_string(),
        kind,
        size,
        mode: value["mode"].as_u64().unwrap_or(0) as u32,
        modified_unix,
    }
}

/// A sandbox path as envd shows it: absolute, relative ones taken from [`HOME`], without
/// `.` components, empty components or a trailing `/`.
pub fn absolute(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    if !path.starts_with('/') {
        parts.extend(HOME.split('/').filter(|s| !s.is_empty()));
    }
    parts.extend(path.split('/').filter(|s| !s.is_empty() && *s != "."));
    format!("/{}", parts.join("/"))
}

/// The parent directory and the last component of an absolute sandbox path (`None` for `/`).
pub fn split_parent(path: &str) -> Option<(String, String)> {
    let path = absolute(path);
    let (parent, name) = path.rsplit_once('/')?;
    if name.is_empty() {
        return None;
    }
    let parent = if parent.is_empty() { "/" } else { parent };
    Some((parent.to_string(), name.to_string()))
}

fn join(dir: &str, name: &str) -> String {
    let dir = absolute(dir);
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Go's `FileMode.String()`, which envd reports as `permissions`.
fn permissions(entry: &SandboxEntry) -> String {
    let kind = match entry.kind {
        "dir" => 'd',
        "symlink" => 'L',
        _ => '-',
    };
    let bits: String = (0..9)
        .map(|i| {
            if entry.mode & (0o400 >> i) != 0 {
                ['r', 'w', 'x'][i % 3]
            } else {
                '-'
            }
        })
        .collect();
    format!("{kind}{bits}")
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

// ---------------------------------------------------------------------- watch events

/// envd's `EventType` (proto3 JSON name) of a watch event.
pub fn event_type(kind: FsEventKind) -> &'static str {
    match kind {
        FsEventKind::Create => "EVENT_TYPE_CREATE",
        FsEventKind::Write => "EVENT_TYPE_WRITE",
        FsEventKind::Remove => "EVENT_TYPE_REMOVE",
        FsEventKind::Rename => "EVENT_TYPE_RENAME",
        FsEventKind::Chmod => "EVENT_TYPE_CHMOD",
    }
}

/// A `FilesystemEvent`: `{"name": <relative path>, "type": "EVENT_TYPE_…"}`.
pub fn filesystem_event(kind: FsEventKind, name: &str) -> Value {
    json!({"name": name, "type": event_type(kind)})
}

// ---------------------------------------------------------------------- process events

/// `{"event": {"start": {"pid": ...}}}`
pub fn start_event(pid: u32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

/// `{"event": {"data": {"stdout" | "stderr": <base64>}}}`
pub fn data_event(stdout: bool, data: &[u8]) -> Value {
    let encoded = base64::engine::general_purpose::STANDARD.encode(data);
    let field = if stdout { "stdout" } else { "stderr" };
    json!({"event": {"data": {field: encoded}}})
}

/// `{"event": {"data": {"pty": <base64>}}}`: a terminal's output.
pub fn pty_event(data: &[u8]) -> Value {
    let encoded = base64::engine::general_purpose::STANDARD.encode(data);
    json!({"event": {"data": {"pty": encoded}}})
}

/// `{"event": {"keepalive": {}}}`, sent when the stream has been quiet for the interval
/// the client asked for (`Keepalive-Ping-Interval`).
pub fn keepalive_event() -> Value {
    json!({"event": {"keepalive": {}}})
}

/// The `EndEvent` as envd fills it from Go's `ProcessState`: `exitCode` absent on success
/// (proto3 JSON omits zero), `-1` when killed by a signal; `exited` only for a normal exit;
/// `status` Go's text (`exit status 3`, `signal: killed`), repeated in `error` on failure.
pub fn end_event(exit: &ExitInfo) -> Value {
    let mut end = Map::new();
    let killed = exit.signal.or(match exit.reason {
        ExitReason::Cancelled | ExitReason::TimedOut => Some(9),
        ExitReason::Exited => None,
    });
    let status = match (killed, exit.code) {
        (Some(signal), _) => {
            end.insert("exitCode".into(), json!(-1));
            format!("signal: {}", signal_name(signal))
        }
        (None, Some(code)) => {
            if code != 0 {
                end.insert("exitCode".into(), json!(code));
            }
            end.insert("exited".into(), json!(true));
            format!("exit status {code}")
        }
        (None, None) => {
            end.insert("exitCode".into(), json!(-1));
            "exit status unknown".to_string()
        }
    };
    if killed.is_some() || exit.code != Some(0) {
        end.insert("error".into(), json!(status));
    }
    end.insert("status".into(), json!(status));
    json!({"event": {"end": end}})
}

/// Go's signal names, as `ProcessState.String()` writes them.
fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        other => format!("signal {other}"),
    }
}

/// envd reports a killed process as `status: "signal: killed"` and the like.
pub fn signal_of(status: &str) -> Option<i32> {
    let name = status.strip_prefix("signal: ")?;
    Some(match name {
        "killed" => 9,
        "terminated" => 15,
        "interrupt" => 2,
        "hangup" => 1,
        _ => return None,
    })
}

/// One event of a Start or Connect stream, as a client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    Start { pid: u64 },
    Stdout(Bytes),
    Stderr(Bytes),
    End(ExitInfo),
    Keepalive,
    Other,
}

/// Reads one stream message (`{"event": {...}}`).
pub fn parse_event(message: &Value) -> ProcessEvent {
    let event = &message["event"];
    if let Some(pid) = event["start"]["pid"].as_u64() {
        return ProcessEvent::Start { pid };
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    for (field, stdout) in [("stdout", true), ("stderr", false)] {
        if let Some(data) = event["data"][field].as_str() {
            let bytes = Bytes::from(b64.decode(data).unwrap_or_default());
            return if stdout {
                ProcessEvent::Stdout(bytes)
            } else {
                ProcessEvent::Stderr(bytes)
            };
        }
    }
    if let Some(end) = event.get("end") {
        let status = end["status"].as_str().unwrap_or("");
        // envd writes -1 for a process killed by a signal; 0 is omitted.
        let code = Some(end["exitCode"].as_i64().unwrap_or(0) as i32);
        let signal = signal_of(status);
        return ProcessEvent::End(ExitInfo {
            code,
            signal,
            reason: ExitReason::Exited,
        });
    }
    if event.get("keepalive").is_some() {
        return ProcessEvent::Keepalive;
    }
    ProcessEvent::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: Option<i32>, signal: Option<i32>, reason: ExitReason) -> ExitInfo {
        ExitInfo {
            code,
            signal,
            reason,
        }
    }

    #[test]
    fn end_events_follow_proto3_json_and_read_back() {
        let ok = end_event(&exit(Some(0), None, ExitReason::Exited));
        assert_eq!(
            ok,
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        let failed = end_event(&exit(Some(3), None, ExitReason::Exited));
        assert_eq!(failed["event"]["end"]["exitCode"], 3);
        assert_eq!(failed["event"]["end"]["error"], "exit status 3");
        let killed = end_event(&exit(None, None, ExitReason::Cancelled));
        assert_eq!(killed["event"]["end"]["exitCode"], -1);
        assert_eq!(killed["event"]["end"]["status"], "signal: killed");
        assert!(killed["event"]["end"].get("exited").is_none());
        for info in [
            exit(Some(0), None, ExitReason::Exited),
            exit(Some(3), None, ExitReason::Exited),
            exit(None, Some(15), ExitReason::Exited),
        ] {
            let ProcessEvent::End(read) = parse_event(&end_event(&info)) else {
                panic!("not an end event");
            };
            assert_eq!(read.signal, info.signal);
            if info.signal.is_none() {
                assert_eq!(read.code, info.code);
            } else {
                assert_eq!(read.code, Some(-1));
            }
        }
    }

    #[test]
    fn data_and_start_events_read_back() {
        assert_eq!(
            parse_event(&data_event(false, b"\xffx")),
            ProcessEvent::Stderr(Bytes::from_static(b"\xffx"))
        );
        assert_eq!(
            parse_event(&start_event(42)),
            ProcessEvent::Start { pid: 42 }
        );
        assert_eq!(parse_event(&keepalive_event()), ProcessEvent::Keepalive);
        assert_eq!(parse_event(&json!({"x": 1})), ProcessEvent::Other);
    }

    #[test]
    fn entries_read_back_and_paths_are_envds() {
        let entry = SandboxEntry {
            name: "notes.txt".into(),
            kind: "file",
            size: 1 << 40,
            mode: 0o644,
            modified_unix: 1_700_000_000,
        };
        let info = entry_info("/home/user/", &entry);
        assert_eq!(info["path"], "/home/user/notes.txt");
        assert_eq!(info["size"], "1099511627776");
        assert_eq!(info["permissions"], "-rw-r--r--");
        assert_eq!(entry_from_info(&info), entry);
        assert_eq!(absolute("a/./b/"), "/home/user/a/b");
        assert_eq!(absolute("//tmp//x"), "/tmp/x");
        assert_eq!(absolute("/"), "/");
        assert_eq!(
            split_parent("notes.txt"),
            Some(("/home/user".into(), "notes.txt".into()))
        );
        assert_eq!(split_parent("/tmp"), Some(("/".into(), "tmp".into())));
        assert_eq!(split_parent("/"), None);
        assert_eq!(entry_info("/", &entry)["path"], "/notes.txt");
    }
}
