//! Golden tables: the exact bytes each kind of answer prints with `-o table`, `-o wide`
//! and `-q`. Columns are a contract (scripts read them); a change here is a change to it.

use serde_json::{json, Value};

use super::super::output::{self, render, Format};
use super::*;

const DAY_MS: i64 = 86_400_000;

fn sandbox(id: &str, state: &str, pool: Value, days: i64) -> Value {
    json!({
        "id": id, "workspace": "default", "state": state,
        "labels": {"team": "a", "via": "cli"},
        "placement": if pool.is_null() { Value::Null } else {
            json!({"pool": pool, "provider": "local", "account": "local", "instance_id": "i-1"})
        },
        "created_ms": output::now_ms() - days * DAY_MS - 1000,
        "egress": {"token": "sgt_secret"},
    })
}

#[test]
fn sandbox_table_wide_and_ids() {
    let s = sandbox("sb-1", "running", json!("local"), 3);
    assert_eq!(
        render(Format::Table, false, &s, &SANDBOX),
        "ID    STATE    POOL   AGE  LABELS\n\
         sb-1  running  local  3d   team=a,via=cli\n"
    );
    assert_eq!(
        render(Format::Wide, false, &s, &SANDBOX),
        "ID    STATE    POOL   AGE  LABELS          WORKSPACE  PROVIDER  ACCOUNT  INSTANCE\n\
         sb-1  running  local  3d   team=a,via=cli  default    local     local    i-1\n"
    );
    assert_eq!(render(Format::Table, true, &s, &SANDBOX), "sb-1\n");
}

#[test]
fn sandbox_list_has_a_row_per_sandbox_and_dashes_for_what_is_missing() {
    let list = json!({"sandboxes": [
        sandbox("sb-1", "running", json!("local"), 3),
        sandbox("sb-22", "pending", Value::Null, 0),
    ], "next_cursor": null});
    let table = render(Format::Table, false, &list, &SANDBOX_LIST);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "ID     STATE    POOL   AGE  LABELS");
    assert_eq!(lines[1], "sb-1   running  local  3d   team=a,via=cli");
    assert_eq!(lines[2], "sb-22  pending  -      1s   team=a,via=cli");
    assert_eq!(lines.len(), 3);
    assert_eq!(
        render(Format::Table, true, &list, &SANDBOX_LIST),
        "sb-1\nsb-22\n"
    );
    let empty = json!({"sandboxes": []});
    assert_eq!(
        render(Format::Table, false, &empty, &SANDBOX_LIST),
        "ID  STATE  POOL  AGE  LABELS\n"
    );
    assert_eq!(render(Format::Table, true, &empty, &SANDBOX_LIST), "");
}

#[test]
fn json_is_the_body_and_yaml_the_same_document() {
    let s = sandbox("sb-1", "running", json!("local"), 0);
    let printed: Value = serde_json::from_str(&render(Format::Json, false, &s, &SANDBOX)).unwrap();
    assert_eq!(printed, s);
    let yaml: Value = serde_norway::from_str(&render(Format::Yaml, false, &s, &SANDBOX)).unwrap();
    assert_eq!(yaml, s);
}

#[test]
fn files_ls_shows_modes_like_ls() {
    let listing = json!({"path": "/home/user", "entries": [
        {"name": "a.txt", "kind": "file", "size": 5, "mode": 420, "modified_unix": 1_700_000_000},
        {"name": "bin", "kind": "dir", "size": 4096, "mode": 493, "modified_unix": 1_700_000_060},
        {"name": "link", "kind": "symlink", "size": 3, "mode": 511, "modified_unix": 0},
    ]});
    assert_eq!(
        render(Format::Table, false, &listing, &FILES),
        "MODE        SIZE  MODIFIED          NAME\n\
         -rw-r--r--  5     2023-11-14 22:13  a.txt\n\
         drwxr-xr-x  4096  2023-11-14 22:14  bin\n\
         lrwxrwxrwx  3     1970-01-01 00:00  link\n"
    );
    assert_eq!(
        render(Format::Table, true, &listing, &FILES),
        "a.txt\nbin\nlink\n"
    );
    assert_eq!(mode_string("file", 0o4755), "-rwsr-xr-x");
    assert_eq!(mode_string("dir", 0o1777), "drwxrwxrwt");
    assert_eq!(mode_string("file", 0o2640), "-rw-r-S---");
    assert_eq!(mode_string("other", 0), "?---------");
}

#[test]
fn snapshot_and_plan() {
    let taken = json!({"snapshot": {"id": "snap-1", "kind": "filesystem", "sandbox_id": "sb-1",
        "pool": "local", "provider": "local", "workspace": "default", "size_bytes": 1536}});
    assert_eq!(
        render(Format::Table, false, &taken, &SNAPSHOT),
        "SNAPSHOT  KIND        SANDBOX  POOL   SIZE\n\
         snap-1    filesystem  sb-1     local  1.5KiB\n"
    );
    assert_eq!(render(Format::Table, true, &taken, &SNAPSHOT), "snap-1\n");
    let plan = json!({"dry_run": true, "plan": []});
    assert_eq!(
        render(Format::Table, false, &plan, &DOCUMENT),
        output::document(&plan)
    );
}

#[test]
fn server_text_cannot_move_the_cursor() {
    let mut s = sandbox("sb-1", "running", json!("lo\u{1b}[2Jcal"), 0);
    s["labels"] = json!({"x": "\u{7}bell"});
    let table = render(Format::Table, false, &s, &SANDBOX);
    assert!(
        !table.contains('\u{1b}') && !table.contains('\u{7}'),
        "{table:?}"
    );
    assert!(table.contains("lo\\u{1b}[2Jcal"), "{table}");
}

#[test]
fn errors_have_one_shape() {
    let body = json!({"error": {"code": "not_found", "message": "no sandbox sb-x",
        "details": {"sandbox_id": "sb-x", "attempts": 2}}});
    assert_eq!(
        output::api_error(None, 404, &body),
        "error: not_found: no sandbox sb-x\n  attempts: 2\n  sandbox_id: sb-x\n"
    );
    assert_eq!(
        output::api_error(Some(Format::Json), 404, &body),
        output::document(&body)
    );
    // Not sandgate's shape (a proxy in between): the status and the text.
    assert_eq!(
        output::api_error(None, 502, &json!("Bad Gateway")),
        "error: http_502: Bad Gateway\n"
    );
    assert_eq!(output::exit_code(404), output::NOT_FOUND);
    assert_eq!(output::exit_code(403), output::FAILED);
    assert_eq!(output::exit_code(201), output::OK);
}

#[test]
fn ages_and_sizes() {
    let now = 10 * DAY_MS;
    assert_eq!(output::age(Some(now - 45_000), now), "45s");
    assert_eq!(output::age(Some(now - 12 * 60_000), now), "12m");
    assert_eq!(output::age(Some(now - 5 * 3_600_000), now), "5h");
    assert_eq!(output::age(Some(now - 3 * DAY_MS), now), "3d");
    assert_eq!(output::age(None, now), "-");
    assert_eq!(bytes(512), "512B");
    assert_eq!(bytes(20 * 1024 * 1024), "20MiB");
}
