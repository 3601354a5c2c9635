//! The store's whole surface, one set of tests for both backends: each test runs against
//! SQLite (a temporary file) and against Postgres (a database of its own on the server
//! `SANDGATE_TEST_POSTGRES_URL` names, created and dropped by the test). Outside CI, without
//! that variable, the Postgres half prints `SKIPPED` and passes; under CI it fails.
//!
//! The sequences follow the coordinator's (src/create/mod.rs): insert with a key claim,
//! replay, expiry and reclaim, attempt start and end, placement, samples, leases, the
//! janitor's abandoned-instance watch.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use futures_util::FutureExt;
use sandgate::store::delegations::DelegationRow;
use sandgate::store::replicas::ReplicaRow;
use sandgate::store::sandboxes::{
    AbandonedRow, AttemptEnd, AttemptRow, Fence, IdempotencyClaim, InsertOutcome, ListFilter,
    SandboxRow, Success,
};
use sandgate::store::snapshots::{SnapshotRow, FILESYSTEM_EXPORT, PROVIDER_SNAPSHOT};
use sandgate::store::StoreError;
use sandgate::store::{DatabaseUrl, Dialect, Store};
use serde_json::json;

use crate::common::postgres::{self, TestDatabase};

// ------------------------------------------------------------------------------ harness

/// Where a test's store lives, so a second, independent store (its own pool, as another
/// replica or a restarted gateway would have) can be opened on the same data.
enum Target {
    Sqlite(PathBuf),
    Postgres(DatabaseUrl),
}

struct Fixture {
    store: Store,
    target: Target,
}

impl Fixture {
    /// Another store on the same database, with its own connections.
    async fn another(&self) -> Store {
        match &self.target {
            Target::Sqlite(path) => Store::open_sqlite(path).await.unwrap(),
            Target::Postgres(url) => Store::open_postgres(url).await.unwrap(),
        }
    }
}

impl Fixture {
    /// On Postgres, makes SERIALIZABLE the database's default isolation for new sessions
    /// (as a cautious DBA might), so a test shows the store does not depend on the server's
    /// READ COMMITTED default. Nothing on SQLite.
    async fn strict_isolation(&self) {
        use sqlx::Connection;
        let Target::Postgres(url) = &self.target else {
            return;
        };
        let mut conn = sqlx::PgConnection::connect(url.expose()).await.unwrap();
        sqlx::raw_sql(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation TO serializable', current_database()); END $$",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
}

/// Runs `test` on SQLite, then on Postgres (or prints why not). A failure names the backend.
async fn each_backend<F, Fut>(name: &str, test: F)
where
    F: Fn(Fixture) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/sandgate.db");
    let store = Store::open_sqlite(&path).await.unwrap();
    assert_eq!(store.dialect(), Dialect::Sqlite);
    let fixture = Fixture {
        store,
        target: Target::Sqlite(path),
    };
    if let Err(panic) = AssertUnwindSafe(test(fixture)).catch_unwind().await {
        eprintln!("{name} failed on SQLite");
        std::panic::resume_unwind(panic);
    }

    let Some(server) = postgres::server_or_skip(name) else {
        return;
    };
    let db = TestDatabase::create(&server, name).await;
    let outcome = AssertUnwindSafe(async {
        let store = Store::open_postgres(&db.url).await.unwrap();
        assert_eq!(store.dialect(), Dialect::Postgres);
        let fixture = Fixture {
            store: store.clone(),
            target: Target::Postgres(db.url.clone()),
        };
        test(fixture).await;
        store.close().await;
    })
    .catch_unwind()
    .await;
    // Dropped whatever the outcome, so a failing test leaves no database behind.
    db.drop().await;
    if let Err(panic) = outcome {
        eprintln!("{name} failed on Postgres");
        std::panic::resume_unwind(panic);
    }
}

// ------------------------------------------------------------------------------ rows

fn sandbox(
    id: &str,
    workspace: &str,
    state: &str,
    labels: serde_json::Value,
    at: i64,
) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        workspace: workspace.into(),
        principal_json: json!({"id": "alice", "workspace": workspace}).to_string(),
        state: state.into(),
        request_json: json!({"labels": labels, "note": "ünïcode ✓"}).to_string(),
        labels_json: labels.to_string(),
        candidates_json: json!([{"pool": "pool-a"}]).to_string(),
        placement_json: None,
        placement_record_json: Some(json!({"considered": 1}).to_string()),
        error_json: None,
        // Every byte value, as a sealed token is arbitrary binary.
        token_sealed: (0..=255u8).rev().collect(),
        created_ms: at,
        updated_ms: at,
        expires_ms: None,
    }
}

fn placement(pool: &str, instance: &str) -> String {
    json!({"pool": pool, "provider": "sim", "account": "acct", "instance_id": instance}).to_string()
}

fn attempt(sandbox_id: &str, seq: i64, pool: &str) -> AttemptRow {
    AttemptRow {
        id: format!("{sandbox_id}-a{seq}"),
        sandbox_id: sandbox_id.into(),
        seq,
        pool: pool.into(),
        provider: "sim".into(),
        account: format!("acct-{pool}"),
        state: "in_flight".into(),
        outcome: None,
        error_class: None,
        message: None,
        instance_id: None,
        started_ms: 1_000 + seq,
        finished_ms: None,
        retries_json: None,
    }
}

fn claim<'a>(key: &'a str, hash: &'a str, expires_ms: i64) -> Option<IdempotencyClaim<'a>> {
    Some(IdempotencyClaim {
        key,
        body_hash: hash,
        expires_ms,
    })
}

/// The fields of a row, to compare rows (the row types do not implement `PartialEq`).
/// The lease [`insert`] gives a sandbox: owner-1, epoch 0 (no takeover yet).
fn fence() -> Fence {
    Fence {
        owner: "owner-1".into(),
        epoch: 0,
    }
}

fn same<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

async fn insert(store: &Store, row: &SandboxRow) {
    let outcome = store
        .insert_sandbox(
            row,
            "owner-1",
            row.created_ms + 15_000,
            None,
            row.created_ms,
        )
        .await
        .unwrap();
    assert!(matches!(outcome, InsertOutcome::Created));
}

fn ids(rows: &[SandboxRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

// ------------------------------------------------------------------------------ tests

#[test]
fn postgres_tests_skip_outside_ci_and_fail_under_it() {
    assert!(postgres::verdict("t", None, false).unwrap().is_none());
    assert!(postgres::verdict("t", Some(" ".into()), false)
        .unwrap()
        .is_none());
    let err = postgres::verdict("t", None, true).unwrap_err();
    assert!(err.contains(postgres::URL_ENV), "{err}");
    assert!(postgres::verdict("t", Some("mysql://x/y".into()), false).is_err());
    let url = postgres::verdict("t", Some("postgres://u:pw@h/db".into()), true)
        .unwrap()
        .unwrap();
    assert_eq!(url.with_database("x").expose(), "postgres://u:pw@h/x");
}

#[tokio::test]
async fn idempotency_key_claim_replay_expiry_and_reclaim() {
    each_backend(
        "idempotency_key_claim_replay_expiry_and_reclaim",
        |fx| async move {
            let s = &fx.store;
            let first = sandbox("sb-1", "ws-a", "pending", json!({}), 1_000);
            let outcome = s
                .insert_sandbox(
                    &first,
                    "owner-1",
                    16_000,
                    claim("key-1", "hash-1", 5_000),
                    1_000,
                )
                .await
                .unwrap();
            assert!(matches!(outcome, InsertOutcome::Created));
            assert_eq!(
                s.find_idempotency_key("ws-a", "key-1", 1_001)
                    .await
                    .unwrap(),
                Some(("hash-1".into(), "sb-1".into()))
            );
            // The stored row is the row inserted, byte for byte.
            assert!(same(&s.get_sandbox("sb-1").await.unwrap().unwrap(), &first));

            // The same key again, while held: the holder is returned and nothing is inserted.
            let second = sandbox("sb-2", "ws-a", "pending", json!({}), 2_000);
            match s
                .insert_sandbox(
                    &second,
                    "owner-1",
                    17_000,
                    claim("key-1", "hash-2", 9_000),
                    2_000,
                )
                .await
                .unwrap()
            {
                InsertOutcome::Existing {
                    sandbox_id,
                    body_hash,
                } => {
                    assert_eq!(sandbox_id, "sb-1");
                    assert_eq!(body_hash, "hash-1");
                }
                InsertOutcome::Created => panic!("a held key was claimed twice"),
            }
            assert!(s.get_sandbox("sb-2").await.unwrap().is_none());

            // Keys are per workspace.
            let other = sandbox("sb-3", "ws-b", "pending", json!({}), 2_000);
            let outcome = s
                .insert_sandbox(
                    &other,
                    "owner-1",
                    17_000,
                    claim("key-1", "hash-3", 9_000),
                    2_000,
                )
                .await
                .unwrap();
            assert!(matches!(outcome, InsertOutcome::Created));

            // Expired (expires_ms <= now): not found, and the next claim takes it over.
            assert_eq!(
                s.find_idempotency_key("ws-a", "key-1", 5_000)
                    .await
                    .unwrap(),
                None
            );
            let third = sandbox("sb-4", "ws-a", "pending", json!({}), 6_000);
            let outcome = s
                .insert_sandbox(
                    &third,
                    "owner-1",
                    21_000,
                    claim("key-1", "hash-4", 50_000),
                    6_000,
                )
                .await
                .unwrap();
            assert!(matches!(outcome, InsertOutcome::Created));
            assert_eq!(
                s.find_idempotency_key("ws-a", "key-1", 6_000)
                    .await
                    .unwrap(),
                Some(("hash-4".into(), "sb-4".into()))
            );

            // No key: always inserted.
            insert(s, &sandbox("sb-5", "ws-a", "pending", json!({}), 7_000)).await;
            // A duplicate sandbox id is an error, not a second row.
            assert!(s
                .insert_sandbox(&first, "owner-1", 16_000, None, 1_000)
                .await
                .is_err());

            // Purging drops the expired holds only: ws-b's (9 000) at 10 000, ws-a's (50 000) stays.
            assert_eq!(s.purge_idempotency_keys(10_000).await.unwrap(), 1);
            assert_eq!(
                s.find_idempotency_key("ws-b", "key-1", 0).await.unwrap(),
                None
            );
            assert!(s
                .find_idempotency_key("ws-a", "key-1", 10_000)
                .await
                .unwrap()
                .is_some());
            assert_eq!(s.purge_idempotency_keys(10_000).await.unwrap(), 0);
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_creates_on_two_connections_have_one_winner() {
    each_backend(
        "concurrent_identical_creates_on_two_connections_have_one_winner",
        |fx| async move {
            // Two stores: two pools, as two replicas would have, on a server whose default
            // isolation is stricter than the store's transactions assume.
            fx.strict_isolation().await;
            let stores = [fx.another().await, fx.another().await];
            for round in 0..2 {
                let key = format!("key-{round}");
                if round == 1 {
                    // An expired hold: every contender may reclaim it, one does.
                    let old = sandbox("sb-old", "ws", "failed", json!({}), 1);
                    let outcome = stores[0]
                        .insert_sandbox(&old, "o", 0, claim(&key, "old", 10), 1)
                        .await
                        .unwrap();
                    assert!(matches!(outcome, InsertOutcome::Created));
                }
                let mut tasks = Vec::new();
                for i in 0..16 {
                    let store = stores[i % 2].clone();
                    let key = key.clone();
                    tasks.push(tokio::spawn(async move {
                        let row =
                            sandbox(&format!("sb-r{round}-{i}"), "ws", "pending", json!({}), 100);
                        let outcome = store
                            .insert_sandbox(&row, "o", 15_100, claim(&key, "h", 1_000_000), 100)
                            .await
                            .unwrap();
                        (row.id, outcome)
                    }));
                }
                let mut winners = Vec::new();
                let mut held_by = BTreeSet::new();
                for task in tasks {
                    match task.await.unwrap() {
                        (id, InsertOutcome::Created) => winners.push(id),
                        (
                            _,
                            InsertOutcome::Existing {
                                sandbox_id,
                                body_hash,
                            },
                        ) => {
                            assert_eq!(body_hash, "h");
                            held_by.insert(sandbox_id);
                        }
                    }
                }
                assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
                assert_eq!(held_by.into_iter().collect::<Vec<_>>(), winners);
                assert_eq!(
                    stores[1]
                        .find_idempotency_key("ws", &key, 100)
                        .await
                        .unwrap(),
                    Some(("h".into(), winners[0].clone()))
                );
                // The losers' rows were rolled back with their claims.
                let page = stores[0]
                    .list_sandboxes(&ListFilter {
                        state: Some("pending".into()),
                        limit: 100,
                        ..ListFilter::default()
                    })
                    .await
                    .unwrap();
                let pending: Vec<&str> = ids(&page)
                    .into_iter()
                    .filter(|id| id.starts_with(&format!("sb-r{round}-")))
                    .collect();
                assert_eq!(pending, vec![winners[0].as_str()]);
            }
        },
    )
    .await;
}

#[tokio::test]
async fn sandbox_lifetimes_are_stored_found_when_passed_and_moved() {
    each_backend(
        "sandbox_lifetimes_are_stored_found_when_passed_and_moved",
        |fx| async move {
            let store = &fx.store;
            let mut short = sandbox("sb-short", "ws", "running", json!({}), 1_000);
            short.expires_ms = Some(5_000);
            let mut long = sandbox("sb-long", "ws", "running", json!({}), 1_000);
            long.expires_ms = Some(50_000);
            let mut gone = sandbox("sb-gone", "ws", "deleted", json!({}), 1_000);
            gone.expires_ms = Some(2_000);
            for row in [
                &short,
                &long,
                &gone,
                &sandbox("sb-none", "ws", "running", json!({}), 1_000),
            ] {
                insert(store, row).await;
            }
            assert_eq!(
                store
                    .get_sandbox("sb-short")
                    .await
                    .unwrap()
                    .unwrap()
                    .expires_ms,
                Some(5_000)
            );
            assert!(store.expired_sandboxes(4_999, 10).await.unwrap().is_empty());
            // Deleted ones and ones without a lifetime are never listed.
            assert_eq!(
                store.expired_sandboxes(5_000, 10).await.unwrap(),
                ["sb-short"]
            );
            assert!(store
                .set_sandbox_expiry("sb-long", 3_000, 2_000)
                .await
                .unwrap());
            assert_eq!(
                store.expired_sandboxes(6_000, 10).await.unwrap(),
                ["sb-long", "sb-short"],
                "oldest expiry first"
            );
            assert_eq!(
                store.expired_sandboxes(6_000, 1).await.unwrap(),
                ["sb-long"]
            );
            assert!(!store
                .set_sandbox_expiry("sb-gone", 9_000, 2_000)
                .await
                .unwrap());
            assert!(!store
                .set_sandbox_expiry("sb-absent", 9_000, 2_000)
                .await
                .unwrap());
        },
    )
    .await;
}

#[tokio::test]
async fn sandboxes_list_by_workspace_state_label_and_cursor() {
    each_backend(
        "sandboxes_list_by_workspace_state_label_and_cursor",
        |fx| async move {
            let s = &fx.store;
            let rows = [
                sandbox(
                    "sb-a",
                    "ws-1",
                    "running",
                    json!({"team": "red", "odd key": "x'y"}),
                    10,
                ),
                sandbox("sb-b", "ws-1", "pending", json!({"team": "blue"}), 20),
                // Same creation time as sb-b: the id breaks the tie.
                sandbox("sb-c", "ws-1", "running", json!({"team": "red"}), 20),
                sandbox("sb-d", "ws-2", "running", json!({"team": "red"}), 30),
                sandbox("sb-e", "ws-1", "failed", json!({}), 40),
            ];
            for row in &rows {
                insert(s, row).await;
            }
            let list = |f: ListFilter| async move { s.list_sandboxes(&f).await.unwrap() };
            let all = list(ListFilter {
                limit: 100,
                ..ListFilter::default()
            })
            .await;
            assert_eq!(ids(&all), ["sb-a", "sb-b", "sb-c", "sb-d", "sb-e"]);
            for (got, want) in all.iter().zip(&rows) {
                assert!(same(got, want), "{got:?} != {want:?}");
            }
            let ws1 = ListFilter {
                workspace: Some("ws-1".into()),
                limit: 100,
                ..ListFilter::default()
            };
            assert_eq!(
                ids(&list(ws1.clone()).await),
                ["sb-a", "sb-b", "sb-c", "sb-e"]
            );
            let running = ListFilter {
                state: Some("running".into()),
                ..ws1.clone()
            };
            assert_eq!(ids(&list(running.clone()).await), ["sb-a", "sb-c"]);
            let red = ListFilter {
                label: Some(("team".into(), "red".into())),
                ..ws1.clone()
            };
            assert_eq!(ids(&list(red.clone()).await), ["sb-a", "sb-c"]);
            let odd = ListFilter {
                label: Some(("odd key".into(), "x'y".into())),
                ..ListFilter::default()
            };
            assert_eq!(ids(&list(ListFilter { limit: 10, ..odd }).await), ["sb-a"]);
            let none = ListFilter {
                label: Some(("team".into(), "green".into())),
                ..ws1.clone()
            };
            assert!(list(none).await.is_empty());
            let all_filters = ListFilter {
                state: Some("running".into()),
                ..red.clone()
            };
            assert_eq!(ids(&list(all_filters).await), ["sb-a", "sb-c"]);

            // Pages of two, following the cursor.
            let mut seen = Vec::new();
            let mut after = None;
            loop {
                let page = list(ListFilter {
                    after: after.clone(),
                    limit: 2,
                    ..ws1.clone()
                })
                .await;
                if page.is_empty() {
                    break;
                }
                assert!(page.len() <= 2);
                after = page.last().map(|r| r.id.clone());
                seen.extend(page.into_iter().map(|r| r.id));
            }
            assert_eq!(seen, ["sb-a", "sb-b", "sb-c", "sb-e"]);
            // A cursor naming no sandbox yields nothing (rather than everything).
            let unknown = ListFilter {
                after: Some("sb-nope".into()),
                ..ws1.clone()
            };
            assert!(list(unknown).await.is_empty());
            assert!(list(ListFilter { limit: 0, ..ws1 }).await.is_empty());
        },
    )
    .await;
}

#[tokio::test]
async fn transitions_apply_only_from_the_given_states() {
    each_backend(
        "transitions_apply_only_from_the_given_states",
        |fx| async move {
            let s = &fx.store;
            insert(s, &sandbox("sb-1", "ws", "running", json!({}), 10)).await;
            let p = placement("pool-a", "i-1");
            assert!(!s
                .transition_sandbox(
                    "sb-1",
                    &["pending", "provisioning"],
                    "failed",
                    None,
                    Some("{}"),
                    20
                )
                .await
                .unwrap());
            assert!(s
                .transition_sandbox("sb-1", &["running"], "stopped", Some(&p), None, 30)
                .await
                .unwrap());
            let row = s.get_sandbox("sb-1").await.unwrap().unwrap();
            assert_eq!(row.state, "stopped");
            assert_eq!(row.placement_json.as_deref(), Some(p.as_str()));
            assert_eq!(row.updated_ms, 30);
            assert_eq!(row.created_ms, 10);
            // `None` keeps what is there; an error is added.
            assert!(s
                .transition_sandbox(
                    "sb-1",
                    &["paused", "stopped"],
                    "failed",
                    None,
                    Some("{\"e\":1}"),
                    40
                )
                .await
                .unwrap());
            let row = s.get_sandbox("sb-1").await.unwrap().unwrap();
            assert_eq!(row.state, "failed");
            assert_eq!(row.placement_json.as_deref(), Some(p.as_str()));
            assert_eq!(row.error_json.as_deref(), Some("{\"e\":1}"));
            assert!(!s
                .transition_sandbox("sb-1", &[], "running", None, None, 50)
                .await
                .unwrap());
            assert!(!s
                .transition_sandbox("sb-nope", &["failed"], "running", None, None, 50)
                .await
                .unwrap());
            // A state name with quotes is data, not SQL.
            assert!(!s
                .transition_sandbox("sb-1", &["x') OR ('1'='1"], "running", None, None, 60)
                .await
                .unwrap());
            assert_eq!(
                s.get_sandbox("sb-1").await.unwrap().unwrap().state,
                "failed"
            );
        },
    )
    .await;
}

#[tokio::test]
async fn attempts_start_end_and_succeed_and_place() {
    each_backend(
        "attempts_start_end_and_succeed_and_place",
        |fx| async move {
            let s = &fx.store;
            insert(s, &sandbox("sb-1", "ws", "pending", json!({"k": "v"}), 10)).await;

            // First attempt: starts (pending -> provisioning), reconciles, ends advancing.
            let a1 = attempt("sb-1", 1, "pool-a");
            s.start_attempt(&a1, 11, &fence()).await.unwrap();
            let row = s.get_sandbox("sb-1").await.unwrap().unwrap();
            assert_eq!((row.state.as_str(), row.updated_ms), ("provisioning", 11));
            s.set_attempt_state(&a1.id, "reconciling", &fence())
                .await
                .unwrap();
            assert_eq!(
                s.list_attempts("sb-1").await.unwrap()[0].state,
                "reconciling"
            );
            s.finish_attempt(
                &a1.id,
                &AttemptEnd {
                    state: "advanced",
                    outcome: "advance",
                    error_class: Some("capacity"),
                    message: Some("no room: «full»"),
                    instance_id: Some("i-late"),
                    finished_ms: 12,
                },
                &fence(),
            )
            .await
            .unwrap();
            // A later end without an instance keeps the recorded one.
            s.finish_attempt(
                &a1.id,
                &AttemptEnd {
                    state: "abandoned",
                    outcome: "unknown",
                    error_class: Some("capacity"),
                    message: None,
                    instance_id: None,
                    finished_ms: 13,
                },
                &fence(),
            )
            .await
            .unwrap();

            // Second attempt: starting it leaves a provisioning sandbox provisioning.
            let a2 = attempt("sb-1", 2, "pool-b");
            s.start_attempt(&a2, 14, &fence()).await.unwrap();
            assert_eq!(s.get_sandbox("sb-1").await.unwrap().unwrap().updated_ms, 11);
            // (sandbox, seq) is unique, whatever the attempt's id.
            let same_seq = AttemptRow {
                id: "sb-1-other".into(),
                ..attempt("sb-1", 2, "pool-c")
            };
            assert!(s.start_attempt(&same_seq, 15, &fence()).await.is_err());
            assert_eq!(s.list_attempts("sb-1").await.unwrap().len(), 2);

            let p = placement("pool-b", "i-2");
            assert!(s
                .succeed_and_place(&Success {
                    attempt_id: &a2.id,
                    sandbox_id: "sb-1",
                    instance_id: "i-2",
                    pool: "pool-b",
                    latency_ms: 123.5,
                    placement_json: &p,
                    now_ms: 20,
                    fence: &fence(),
                })
                .await
                .unwrap());
            let row = s.get_sandbox("sb-1").await.unwrap().unwrap();
            assert_eq!(row.state, "running");
            assert_eq!(row.placement_json.as_deref(), Some(p.as_str()));
            assert_eq!(row.updated_ms, 20);

            let attempts = s.list_attempts("sb-1").await.unwrap();
            assert_eq!(attempts.len(), 2);
            let first = &attempts[0];
            assert_eq!(first.seq, 1);
            assert_eq!(first.state, "abandoned");
            assert_eq!(first.outcome.as_deref(), Some("unknown"));
            assert_eq!(first.message, None);
            assert_eq!(first.instance_id.as_deref(), Some("i-late"));
            assert_eq!(first.finished_ms, Some(13));
            assert_eq!(first.started_ms, 1_001);
            assert_eq!(first.account, "acct-pool-a");
            let second = &attempts[1];
            assert_eq!(second.state, "succeeded");
            assert_eq!(second.outcome.as_deref(), Some("success"));
            assert_eq!(second.instance_id.as_deref(), Some("i-2"));
            assert_eq!(second.finished_ms, Some(20));
            // The success is a sample with its latency.
            assert_eq!(
                s.samples_since(0).await.unwrap(),
                vec![("pool-b".to_string(), 20, true, Some(123.5))]
            );

            // A sandbox deleted meanwhile is not placed (the attempt still ends).
            insert(s, &sandbox("sb-2", "ws", "pending", json!({}), 30)).await;
            let a = attempt("sb-2", 1, "pool-a");
            s.start_attempt(&a, 31, &fence()).await.unwrap();
            assert!(s
                .transition_sandbox("sb-2", &["provisioning"], "deleted", None, None, 32)
                .await
                .unwrap());
            assert!(!s
                .succeed_and_place(&Success {
                    attempt_id: &a.id,
                    sandbox_id: "sb-2",
                    instance_id: "i-3",
                    pool: "pool-a",
                    latency_ms: 1.0,
                    placement_json: &placement("pool-a", "i-3"),
                    now_ms: 33,
                    fence: &fence(),
                })
                .await
                .unwrap());
            let row = s.get_sandbox("sb-2").await.unwrap().unwrap();
            assert_eq!((row.state.as_str(), row.placement_json), ("deleted", None));
            assert_eq!(s.list_attempts("sb-2").await.unwrap()[0].state, "succeeded");

            // A complete attempt row, as recorded for a dry or synthetic attempt.
            let mut done = attempt("sb-3", 1, "pool-c");
            done.state = "ended".into();
            done.outcome = Some("terminal".into());
            done.error_class = Some("policy".into());
            done.message = Some("denied".into());
            done.finished_ms = Some(99);
            insert(s, &sandbox("sb-3", "ws", "pending", json!({}), 40)).await;
            s.insert_attempt(&done, &fence()).await.unwrap();
            assert!(same(&s.list_attempts("sb-3").await.unwrap()[0], &done));
            assert!(s.insert_attempt(&done, &fence()).await.is_err());
            assert!(s.list_attempts("sb-nope").await.unwrap().is_empty());
        },
    )
    .await;
}

#[tokio::test]
async fn samples_window_newest_latencies_and_delete() {
    each_backend(
        "samples_window_newest_latencies_and_delete",
        |fx| async move {
            let s = &fx.store;
            for (pool, at, ok, latency) in [
                ("a", 100, true, Some(10.0)),
                ("a", 200, false, None),
                ("a", 300, true, Some(30.0)),
                ("a", 300, true, Some(31.0)),
                ("a", 400, true, None),
                ("b", 50, true, Some(5.0)),
                ("b", 250, false, Some(99.0)),
            ] {
                s.record_sample(pool, at, ok, latency).await.unwrap();
            }
            let stats = s.pool_samples(100, 2).await.unwrap();
            assert_eq!(stats.len(), 2);
            let a = &stats["a"];
            assert_eq!((a.attempts, a.successes), (5, 4));
            // The newest two successful latencies (ties broken by insertion order, newest first).
            let mut newest = a.latencies_ms.clone();
            newest.sort_by(f64::total_cmp);
            assert_eq!(newest, vec![30.0, 31.0]);
            let b = &stats["b"];
            assert_eq!((b.attempts, b.successes), (1, 0));
            assert!(b.latencies_ms.is_empty());
            assert!(s.pool_samples(1_000, 10).await.unwrap().is_empty());
            assert_eq!(
                s.pool_samples(0, 10).await.unwrap()["b"].latencies_ms,
                vec![5.0]
            );

            let since = s.samples_since(200).await.unwrap();
            assert_eq!(
                since,
                vec![
                    ("a".to_string(), 200, false, None),
                    ("b".to_string(), 250, false, Some(99.0)),
                    ("a".to_string(), 300, true, Some(30.0)),
                    ("a".to_string(), 300, true, Some(31.0)),
                    ("a".to_string(), 400, true, None),
                ]
            );
            s.delete_samples_before(300).await.unwrap();
            let left: Vec<i64> = s
                .samples_since(0)
                .await
                .unwrap()
                .iter()
                .map(|r| r.1)
                .collect();
            assert_eq!(left, vec![300, 300, 400]);
        },
    )
    .await;
}

#[tokio::test]
async fn live_placements_and_counts_by_pool() {
    each_backend("live_placements_and_counts_by_pool", |fx| async move {
        let s = &fx.store;
        for (id, state, pool) in [
            ("sb-1", "running", Some("pool-a")),
            ("sb-2", "paused", Some("pool-a")),
            ("sb-3", "stopped", Some("pool-b")),
            ("sb-4", "failed", Some("pool-b")),
            ("sb-5", "deleted", Some("pool-a")),
            ("sb-6", "provisioning", None),
            ("sb-7", "running", None),
        ] {
            let mut row = sandbox(id, "ws", state, json!({"app": id}), 10);
            row.placement_json = pool.map(|p| placement(p, &format!("i-{id}")));
            insert(s, &row).await;
        }
        let counts = s.live_counts_by_pool().await.unwrap();
        assert_eq!(
            counts.into_iter().collect::<BTreeMap<_, _>>(),
            BTreeMap::from([("pool-a".to_string(), 2), ("pool-b".to_string(), 1)])
        );
        let mut live = s.live_placements().await.unwrap();
        live.sort();
        assert_eq!(live.len(), 3);
        assert_eq!(live[0].0, json!({"app": "sb-1"}).to_string());
        assert_eq!(live[0].1, placement("pool-a", "i-sb-1"));
        let running: Vec<String> = s
            .running_sandboxes()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(running, ["sb-1", "sb-2", "sb-3", "sb-7"]);
    })
    .await;
}

#[tokio::test]
async fn abandoned_instances_are_watched_until_their_deadline() {
    each_backend(
        "abandoned_instances_are_watched_until_their_deadline",
        |fx| async move {
            let s = &fx.store;
            let row = |n: &str| AbandonedRow {
                attempt_id: format!("sb-1-a{n}"),
                sandbox_id: "sb-1".into(),
                pool: format!("pool-{n}"),
                account: format!("acct-{n}"),
            };
            s.record_abandoned(&row("1"), "reconcile window passed", 100, 1_000)
                .await
                .unwrap();
            s.record_abandoned(&row("2"), "deleted while provisioning", 200, 500)
                .await
                .unwrap();
            // Recording again extends the watch, never shortens it.
            s.record_abandoned(&row("2"), "again", 300, 2_000)
                .await
                .unwrap();
            s.record_abandoned(&row("1"), "again", 400, 10)
                .await
                .unwrap();
            let watched = |at| async move { s.watched_abandoned(at).await.unwrap() };
            let at_0: Vec<String> = watched(0).await.into_iter().map(|r| r.attempt_id).collect();
            assert_eq!(at_0, ["sb-1-a1", "sb-1-a2"]);
            let at_1000 = watched(1_000).await;
            assert_eq!(at_1000.len(), 1);
            assert!(same(&at_1000[0], &row("2")));
            assert!(watched(2_000).await.is_empty());

            assert_eq!(s.abandoned_deleted_count("sb-1-a1").await.unwrap(), Some(0));
            s.count_abandoned_deleted("sb-1-a1", 2).await.unwrap();
            s.count_abandoned_deleted("sb-1-a1", 1).await.unwrap();
            s.count_abandoned_deleted("sb-nope", 1).await.unwrap();
            assert_eq!(s.abandoned_deleted_count("sb-1-a1").await.unwrap(), Some(3));
            assert_eq!(s.abandoned_deleted_count("sb-nope").await.unwrap(), None);
        },
    )
    .await;
}

/// Issue 25 item 9: the janitor's next look at an abandoned attempt is put off, doubling from
/// the base up to the maximum; a row not due is not listed.
#[tokio::test]
async fn an_abandoned_attempt_is_checked_ever_less_often() {
    each_backend(
        "an_abandoned_attempt_is_checked_ever_less_often",
        |fx| async move {
            let s = &fx.store;
            let row = AbandonedRow {
                attempt_id: "sb-1-a1".into(),
                sandbox_id: "sb-1".into(),
                pool: "pool-a".into(),
                account: "acct-a".into(),
            };
            s.record_abandoned(&row, "unknown_outcome", 0, 1_000_000)
                .await
                .unwrap();
            let due = |at| async move { s.watched_abandoned(at).await.unwrap().len() };
            assert_eq!(due(0).await, 1, "due at once");
            let mut at = 0;
            let mut pauses = Vec::new();
            for _ in 0..6 {
                let next = s
                    .abandoned_checked("sb-1-a1", at, 100, 1_000)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(due(next - 1).await, 0, "not due before {next}");
                assert_eq!(due(next).await, 1);
                pauses.push(next - at);
                at = next;
            }
            assert_eq!(pauses, [100, 200, 400, 800, 1_000, 1_000]);
            assert_eq!(
                s.abandoned_checked("sb-nope", 0, 100, 1_000).await.unwrap(),
                None
            );
        },
    )
    .await;
}

/// Issue 25 item 6: an attempt's retries are stored with it (fenced like its other writes).
#[tokio::test]
async fn an_attempts_retries_are_recorded() {
    each_backend("an_attempts_retries_are_recorded", |fx| async move {
        let s = &fx.store;
        insert(s, &sandbox("sb-1", "ws", "pending", json!({}), 10)).await;
        let a1 = attempt("sb-1", 1, "pool-a");
        s.start_attempt(&a1, 11, &fence()).await.unwrap();
        assert_eq!(s.list_attempts("sb-1").await.unwrap()[0].retries_json, None);
        let retries =
            r#"[{"at_ms":12,"error_class":"provider_error","message":"500","wait_ms":200}]"#;
        s.set_attempt_retries(&a1.id, retries, &fence())
            .await
            .unwrap();
        assert_eq!(
            s.list_attempts("sb-1").await.unwrap()[0]
                .retries_json
                .as_deref(),
            Some(retries)
        );
        let stale = Fence {
            owner: "owner-2".into(),
            epoch: 0,
        };
        assert!(s.set_attempt_retries(&a1.id, "[]", &stale).await.is_err());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_claim_renew_and_release() {
    each_backend("leases_claim_renew_and_release", |fx| async move {
        let s = &fx.store;
        // In flight with a lease expiring at 1 000 (owner-1), plus settled ones.
        for (id, state) in [
            ("sb-1", "pending"),
            ("sb-2", "provisioning"),
            ("sb-3", "reconciling"),
            ("sb-4", "running"),
            ("sb-5", "failed"),
        ] {
            let row = sandbox(id, "ws", state, json!({}), 10);
            s.insert_sandbox(&row, "owner-1", 1_000, None, 10)
                .await
                .unwrap();
        }
        assert_eq!(
            s.lease("sb-1").await.unwrap(),
            Some((Some("owner-1".into()), 1_000))
        );
        assert_eq!(s.lease("sb-nope").await.unwrap(), None);
        // Not expired yet: nothing to take.
        assert!(s
            .claim_expired_creates("owner-2", 999, 5_000)
            .await
            .unwrap()
            .is_empty());
        // The owner renews what it holds in flight.
        s.renew_leases("owner-1", 2_000).await.unwrap();
        assert_eq!(
            s.lease("sb-3").await.unwrap(),
            Some((Some("owner-1".into()), 2_000))
        );
        assert_eq!(
            s.lease("sb-4").await.unwrap(),
            Some((Some("owner-1".into()), 1_000))
        );
        s.renew_leases("owner-9", 9_000).await.unwrap();
        assert_eq!(
            s.lease("sb-1").await.unwrap(),
            Some((Some("owner-1".into()), 2_000))
        );

        // Expired: two coordinators on two connections race; each create goes to one.
        let other = fx.another().await;
        let (x, y) = tokio::join!(
            s.claim_expired_creates("owner-2", 2_000, 7_000),
            other.claim_expired_creates("owner-3", 2_000, 7_000),
        );
        let (x, y) = (x.unwrap(), y.unwrap());
        let mut all: Vec<String> = x.iter().chain(&y).cloned().collect();
        all.sort();
        assert_eq!(
            all,
            ["sb-1", "sb-2", "sb-3"],
            "owner-2 {x:?}, owner-3 {y:?}"
        );
        for id in &x {
            assert_eq!(
                s.lease(id).await.unwrap(),
                Some((Some("owner-2".into()), 7_000))
            );
        }
        for id in &y {
            assert_eq!(
                s.lease(id).await.unwrap(),
                Some((Some("owner-3".into()), 7_000))
            );
        }

        // Released: no owner, resumable by anyone from the retry time on.
        // Only by its holder: a stale fence releases nothing.
        let held = s.lease_fence("sb-1").await.unwrap().unwrap();
        let stale = Fence {
            epoch: held.epoch - 1,
            ..held.clone()
        };
        s.release_lease("sb-1", 3_000, &stale).await.unwrap();
        assert_eq!(s.lease("sb-1").await.unwrap().unwrap().1, 7_000);
        s.release_lease("sb-1", 3_000, &held).await.unwrap();
        assert_eq!(s.lease("sb-1").await.unwrap(), Some((None, 3_000)));
        assert_eq!(s.lease_fence("sb-1").await.unwrap(), None);
        assert!(s
            .claim_expired_creates("owner-4", 2_999, 9_000)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.claim_expired_creates("owner-4", 3_000, 9_000)
                .await
                .unwrap(),
            ["sb-1"]
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coordinator_that_lost_its_lease_cannot_write() {
    each_backend(
        "a_coordinator_that_lost_its_lease_cannot_write",
        |fx| async move {
            let s = &fx.store;
            let fenced = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Fenced { .. }));
            // owner-1 holds sb-1 until 15 010 (epoch 0) and starts an attempt.
            insert(s, &sandbox("sb-1", "ws", "pending", json!({}), 10)).await;
            let old = fence();
            assert_eq!(s.lease_fence("sb-1").await.unwrap(), Some(old.clone()));
            let a1 = attempt("sb-1", 1, "pool-a");
            s.start_attempt(&a1, 11, &old).await.unwrap();

            // owner-1 pauses past its lease; owner-2, on another connection, takes over.
            let other = fx.another().await;
            assert_eq!(
                other
                    .claim_expired_creates("owner-2", 20_000, 40_000)
                    .await
                    .unwrap(),
                ["sb-1"]
            );
            let new = other.lease_fence("sb-1").await.unwrap().unwrap();
            assert_eq!(
                new,
                Fence {
                    owner: "owner-2".into(),
                    epoch: 1
                }
            );

            // Every write owner-1's walk would make now touches nothing.
            let a2 = attempt("sb-1", 2, "pool-b");
            assert!(fenced(s.start_attempt(&a2, 21, &old).await));
            assert!(fenced(s.insert_attempt(&a2, &old).await));
            assert!(fenced(
                s.set_attempt_state(&a1.id, "reconciling", &old).await
            ));
            let end = AttemptEnd {
                state: "abandoned",
                outcome: "unknown",
                error_class: Some("unknown"),
                message: None,
                instance_id: None,
                finished_ms: 22,
            };
            assert!(fenced(s.finish_attempt(&a1.id, &end, &old).await));
            let p = placement("pool-a", "i-old");
            fn success<'a>(placement_json: &'a str, fence: &'a Fence) -> Success<'a> {
                Success {
                    attempt_id: "sb-1-a1",
                    sandbox_id: "sb-1",
                    instance_id: "i-old",
                    pool: "pool-a",
                    latency_ms: 1.0,
                    placement_json,
                    now_ms: 23,
                    fence,
                }
            }
            assert!(matches!(
                s.succeed_and_place(&success(&p, &old)).await,
                Err(StoreError::Fenced { .. })
            ));
            assert!(matches!(
                s.transition_fenced("sb-1", &["provisioning"], "failed", None, None, 24, &old)
                    .await,
                Err(StoreError::Fenced { .. })
            ));
            let row = s.get_sandbox("sb-1").await.unwrap().unwrap();
            assert_eq!(
                (row.state.as_str(), row.placement_json),
                ("provisioning", None)
            );
            let attempts = s.list_attempts("sb-1").await.unwrap();
            assert_eq!(attempts.len(), 1);
            assert_eq!(attempts[0].state, "in_flight");
            assert!(s.samples_since(0).await.unwrap().is_empty(), "rolled back");

            // The new owner writes, and a state outside `from` is an answer, not a fence.
            other.finish_attempt(&a1.id, &end, &new).await.unwrap();
            assert!(!other
                .transition_fenced("sb-1", &["running"], "failed", None, None, 25, &new)
                .await
                .unwrap());
            assert!(other.succeed_and_place(&success(&p, &new)).await.unwrap());
            assert_eq!(
                other.get_sandbox("sb-1").await.unwrap().unwrap().state,
                "running"
            );

            // A reclaim by the same owner is a new epoch too.
            insert(s, &sandbox("sb-2", "ws", "pending", json!({}), 10)).await;
            assert_eq!(
                s.claim_expired_creates("owner-1", 20_000, 30_000)
                    .await
                    .unwrap(),
                ["sb-2"]
            );
            assert_eq!(s.lease_fence("sb-2").await.unwrap().unwrap().epoch, 1);
            assert!(fenced(
                s.start_attempt(&attempt("sb-2", 1, "pool-a"), 26, &old)
                    .await
            ));
        },
    )
    .await;
}

#[tokio::test]
async fn snapshots_keep_archive_bytes() {
    each_backend("snapshots_keep_archive_bytes", |fx| async move {
        let s = &fx.store;
        let provider = SnapshotRow {
            id: "snap-1".into(),
            workspace: "ws".into(),
            sandbox_id: "sb-1".into(),
            pool: "pool-a".into(),
            provider: "sim".into(),
            size_bytes: 0,
            created_ms: 10,
            kind: PROVIDER_SNAPSHOT.into(),
        };
        s.insert_snapshot(&provider, None).await.unwrap();
        // An archive with every byte value, NULs included, and big enough to span packets.
        let archive: Vec<u8> = (0..(1 << 20) + 7).map(|i| (i * 31 % 256) as u8).collect();
        let export = SnapshotRow {
            id: "snap-2".into(),
            size_bytes: archive.len() as i64,
            kind: FILESYSTEM_EXPORT.into(),
            ..provider.clone()
        };
        s.insert_snapshot(&export, Some(&archive)).await.unwrap();
        assert!(s.insert_snapshot(&export, None).await.is_err());

        assert_eq!(
            s.get_snapshot("snap-1").await.unwrap(),
            Some(provider.clone())
        );
        assert_eq!(
            s.get_snapshot("snap-2").await.unwrap(),
            Some(export.clone())
        );
        assert_eq!(s.get_snapshot("snap-nope").await.unwrap(), None);
        assert_eq!(s.snapshot_archive("snap-1").await.unwrap(), None);
        assert_eq!(s.snapshot_archive("snap-2").await.unwrap(), Some(archive));
        assert_eq!(s.snapshot_archive("snap-nope").await.unwrap(), None);
        let empty = SnapshotRow {
            id: "snap-3".into(),
            ..export
        };
        s.insert_snapshot(&empty, Some(&[])).await.unwrap();
        assert_eq!(
            s.snapshot_archive("snap-3").await.unwrap(),
            Some(Vec::new())
        );

        assert!(s.delete_snapshot("snap-2").await.unwrap());
        assert!(!s.delete_snapshot("snap-2").await.unwrap());
        assert_eq!(s.get_snapshot("snap-2").await.unwrap(), None);
        assert_eq!(s.get_snapshot("snap-1").await.unwrap(), Some(provider));
    })
    .await;
}

#[tokio::test]
async fn delegations_insert_find_list_and_revoke_once() {
    each_backend(
        "delegations_insert_find_list_and_revoke_once",
        |fx| async move {
            let s = &fx.store;
            let d = |id: &str, hash: &str, sandbox: &str, at: i64| DelegationRow {
                id: id.into(),
                token_hash: hash.into(),
                sandbox_id: sandbox.into(),
                workspace: "ws".into(),
                delegator: "alice".into(),
                agent: "agent-7".into(),
                actions: vec!["exec".into(), "files.read".into()],
                created_ms: at,
                expires_ms: at + 60_000,
                revoked_ms: None,
            };
            let d1 = d("dg-1", "h1", "sb-1", 20);
            let d2 = d("dg-2", "h2", "sb-1", 10);
            let d3 = DelegationRow {
                actions: Vec::new(),
                ..d("dg-3", "h3", "sb-2", 5)
            };
            for row in [&d1, &d2, &d3] {
                s.insert_delegation(row).await.unwrap();
            }
            // Token hashes are unique.
            assert!(s
                .insert_delegation(&d("dg-4", "h1", "sb-1", 30))
                .await
                .is_err());

            assert_eq!(
                s.delegation_by_token_hash("h1").await.unwrap(),
                Some(d1.clone())
            );
            assert_eq!(s.delegation_by_token_hash("nope").await.unwrap(), None);
            assert_eq!(s.get_delegation("dg-3").await.unwrap(), Some(d3.clone()));
            assert_eq!(s.get_delegation("nope").await.unwrap(), None);
            assert_eq!(
                s.list_delegations("sb-1").await.unwrap(),
                vec![d2.clone(), d1.clone()]
            );
            assert!(s.list_delegations("sb-9").await.unwrap().is_empty());

            assert!(s.revoke_delegation("dg-1", 99).await.unwrap());
            assert!(!s.revoke_delegation("dg-1", 100).await.unwrap());
            assert!(!s.revoke_delegation("nope", 100).await.unwrap());
            let revoked = s.get_delegation("dg-1").await.unwrap().unwrap();
            assert_eq!(revoked.revoked_ms, Some(99));
            assert_eq!(
                s.delegation_by_token_hash("h1")
                    .await
                    .unwrap()
                    .unwrap()
                    .revoked_ms,
                Some(99)
            );
        },
    )
    .await;
}

#[tokio::test]
async fn writes_other_replicas_must_see_are_in_the_change_feed() {
    each_backend(
        "writes_other_replicas_must_see_are_in_the_change_feed",
        |fx| async move {
            let a = fx.store.clone().with_origin("replica-a");
            let b = fx.another().await.with_origin("replica-b");
            assert_eq!(a.last_change_seq().await.unwrap(), 0);
            // Postgres wakes listeners at commit; SQLite has no listener.
            let mut listener = b.listen_changes().await.unwrap();
            assert_eq!(listener.is_some(), fx.store.dialect() == Dialect::Postgres);

            insert(&a, &sandbox("sb-1", "ws", "pending", json!({}), 10)).await;
            // In-flight moves record nothing; a sandbox going live or away does.
            assert!(a
                .transition_sandbox("sb-1", &["pending"], "provisioning", None, None, 11)
                .await
                .unwrap());
            assert_eq!(a.last_change_seq().await.unwrap(), 0);
            assert!(a
                .transition_sandbox("sb-1", &["provisioning"], "running", None, None, 12)
                .await
                .unwrap());
            b.upsert_credential("ws", "gh", "{}", b"sealed")
                .await
                .unwrap();
            assert!(b.delete_credential("ws", "gh").await.unwrap());
            assert!(!b.delete_credential("ws", "gh").await.unwrap());

            let rows = b.changes_between(0, i64::MAX, 100).await.unwrap();
            let seen: Vec<(&str, &str, &str)> = rows
                .iter()
                .map(|r| (r.kind.as_str(), r.key.as_str(), r.origin.as_str()))
                .collect();
            let key = sandgate::store::changes::credential_key("ws", "gh");
            assert_eq!(
                seen,
                [
                    ("sandbox", "sb-1", "replica-a"),
                    ("credential", key.as_str(), "replica-b"),
                    ("credential", key.as_str(), "replica-b"),
                ]
            );
            assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq));
            assert_eq!(
                sandgate::store::changes::parse_credential_key(&key),
                Some(("ws".into(), "gh".into()))
            );
            let last = rows.last().unwrap().seq;
            assert_eq!(a.last_change_seq().await.unwrap(), last);
            assert_eq!(
                a.changes_between(rows[0].seq, last - 1, 100).await.unwrap(),
                vec![rows[1].clone()]
            );
            if let Some(listener) = listener.as_mut() {
                tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
                    .await
                    .expect("a NOTIFY arrives")
                    .unwrap();
            }
            // Pruning by age keeps the numbering: the next row continues after the last.
            assert_eq!(a.prune_changes(i64::MAX).await.unwrap(), 3);
            assert!(a
                .changes_between(0, i64::MAX, 100)
                .await
                .unwrap()
                .is_empty());
            a.upsert_credential("ws", "gh", "{}", b"sealed")
                .await
                .unwrap();
            assert!(a.last_change_seq().await.unwrap() > last);
        },
    )
    .await;
}

#[tokio::test]
async fn sealed_values_are_listed_and_resealed_only_if_unchanged() {
    each_backend(
        "sealed_values_are_listed_and_resealed_only_if_unchanged",
        |fx| async move {
            let s = &fx.store;
            // Deployment secrets: the first insert wins.
            assert_eq!(s.store_secret("seed").await.unwrap(), None);
            assert!(s.insert_store_secret("seed", b"one").await.unwrap());
            assert!(!s.insert_store_secret("seed", b"two").await.unwrap());
            assert_eq!(
                s.store_secret("seed").await.unwrap().as_deref(),
                Some(&b"one"[..])
            );
            assert!(!s
                .reseal_store_secret("seed", b"two", b"three")
                .await
                .unwrap());
            assert!(s
                .reseal_store_secret("seed", b"one", b"three")
                .await
                .unwrap());
            assert_eq!(
                s.sealed_store_secrets().await.unwrap(),
                vec![("seed".to_string(), b"three".to_vec())]
            );

            // Sandbox tokens: compare-and-swap on the sealed bytes.
            insert(s, &sandbox("sb-1", "ws", "running", json!({}), 10)).await;
            let tokens = s.sealed_tokens().await.unwrap();
            assert_eq!(tokens.len(), 1);
            let (id, old) = &tokens[0];
            assert_eq!(id, "sb-1");
            assert!(!s.reseal_token("sb-1", b"not it", b"new").await.unwrap());
            assert!(s.reseal_token("sb-1", old, b"new").await.unwrap());
            assert_eq!(
                s.get_sandbox("sb-1").await.unwrap().unwrap().token_sealed,
                b"new".to_vec()
            );

            // Credentials: compare-and-swap on the sealed bytes; the version is the secret's,
            // not the sealing's, so it stays.
            let v = s.upsert_credential("ws", "gh", "{}", b"old").await.unwrap();
            assert!(!s
                .reseal_credential("ws", "gh", b"other", b"new")
                .await
                .unwrap());
            assert!(s
                .reseal_credential("ws", "gh", b"old", b"new")
                .await
                .unwrap());
            let row = s.get_credential("ws", "gh").await.unwrap().unwrap();
            assert_eq!((row.sealed, row.version), (b"new".to_vec(), v));
            assert!(!s
                .reseal_credential("ws", "nope", b"new", b"x")
                .await
                .unwrap());
        },
    )
    .await;
}

#[tokio::test]
async fn replicas_heartbeat_expire_and_leave() {
    each_backend("replicas_heartbeat_expire_and_leave", |fx| async move {
        let s = &fx.store;
        s.ping().await.unwrap();
        let r = |id: &str, generation: i64, seen: i64| ReplicaRow {
            id: id.into(),
            role: "all".into(),
            policy_generation: generation,
            policy_digest: format!("digest-{generation}"),
            started_ms: 1,
            seen_ms: seen,
        };
        s.upsert_replica(&r("b", 1, 100)).await.unwrap();
        s.upsert_replica(&r("a", 1, 100)).await.unwrap();
        // A heartbeat refreshes the row in place: a new generation, a later sighting.
        let a2 = ReplicaRow {
            role: "proxy".into(),
            ..r("a", 2, 200)
        };
        // Seen through another connection pool, as another replica would see it.
        fx.another().await.upsert_replica(&a2).await.unwrap();
        assert_eq!(
            s.live_replicas(0).await.unwrap(),
            vec![a2.clone(), r("b", 1, 100)]
        );
        // One that stopped heartbeating is pruned, and stays gone.
        assert_eq!(s.live_replicas(150).await.unwrap(), vec![a2.clone()]);
        assert_eq!(s.live_replicas(0).await.unwrap(), vec![a2.clone()]);
        s.remove_replica("a").await.unwrap();
        s.remove_replica("nope").await.unwrap();
        assert!(s.live_replicas(0).await.unwrap().is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_insert_upsert_list_and_delete() {
    each_backend(
        "credentials_insert_upsert_list_and_delete",
        |fx| async move {
            let s = &fx.store;
            let sealed: Vec<u8> = vec![0, 1, 2, 255, 0, 128];
            assert_eq!(
                s.insert_credential("ws-b", "gh", "{\"m\":1}", &sealed)
                    .await
                    .unwrap(),
                Some(1)
            );
            assert_eq!(
                s.insert_credential("ws-b", "gh", "{}", &[9]).await.unwrap(),
                None
            );
            assert_eq!(
                s.insert_credential("ws-a", "gh", "{}", &[7]).await.unwrap(),
                Some(1)
            );
            assert_eq!(
                s.upsert_credential("ws-b", "gh", "{\"m\":2}", &[3, 0])
                    .await
                    .unwrap(),
                2
            );
            assert_eq!(
                s.upsert_credential("ws-b", "gh", "{\"m\":3}", &[4])
                    .await
                    .unwrap(),
                3
            );
            assert_eq!(
                s.upsert_credential("ws-a", "npm", "{}", &[]).await.unwrap(),
                1
            );

            let rows = s.list_credentials().await.unwrap();
            let listed: Vec<(String, String, String, Vec<u8>, i64)> = rows
                .into_iter()
                .map(|r| (r.workspace, r.name, r.meta_json, r.sealed, r.version))
                .collect();
            assert_eq!(
                listed,
                vec![
                    ("ws-a".into(), "gh".into(), "{}".into(), vec![7], 1),
                    ("ws-a".into(), "npm".into(), "{}".into(), vec![], 1),
                    ("ws-b".into(), "gh".into(), "{\"m\":3}".into(), vec![4], 3),
                ]
            );

            assert!(s.delete_credential("ws-a", "gh").await.unwrap());
            assert!(!s.delete_credential("ws-a", "gh").await.unwrap());
            assert_eq!(s.list_credentials().await.unwrap().len(), 2);

            // Concurrent creates of one name on two connections: exactly one wins.
            let stores = [s.clone(), fx.another().await];
            let mut tasks = Vec::new();
            for i in 0..8u8 {
                let store = stores[usize::from(i % 2)].clone();
                tasks.push(tokio::spawn(async move {
                    store
                        .insert_credential("ws-c", "race", "{}", &[i])
                        .await
                        .unwrap()
                }));
            }
            let mut won = 0;
            for task in tasks {
                if let Some(version) = task.await.unwrap() {
                    assert_eq!(version, 1);
                    won += 1;
                }
            }
            assert_eq!(won, 1);
            // Concurrent replacements all count.
            let mut tasks = Vec::new();
            for i in 0..8u8 {
                let store = stores[usize::from(i % 2)].clone();
                tasks.push(tokio::spawn(async move {
                    store
                        .upsert_credential("ws-c", "race", "{}", &[i])
                        .await
                        .unwrap()
                }));
            }
            let mut versions: Vec<i64> = Vec::new();
            for task in tasks {
                versions.push(task.await.unwrap());
            }
            versions.sort();
            assert_eq!(versions, (2..=9).collect::<Vec<i64>>());
        },
    )
    .await;
}

#[tokio::test]
async fn recent_failures_counted_per_pool_and_class() {
    each_backend(
        "recent_failures_counted_per_pool_and_class",
        |fx| async move {
            let s = &fx.store;
            insert(s, &sandbox("sb-1", "ws", "pending", json!({}), 10)).await;
            let row =
                |seq: i64, pool: &str, class: Option<&str>, finished: Option<i64>| AttemptRow {
                    state: if class.is_some() {
                        "advanced"
                    } else {
                        "succeeded"
                    }
                    .into(),
                    outcome: Some(
                        if class.is_some() {
                            "advance"
                        } else {
                            "success"
                        }
                        .into(),
                    ),
                    error_class: class.map(str::to_string),
                    finished_ms: finished,
                    ..attempt("sb-1", seq, pool)
                };
            for a in [
                row(1, "a", Some("capacity"), Some(1_000)),
                row(2, "a", Some("capacity"), Some(2_000)),
                row(3, "a", Some("outage"), Some(2_000)),
                row(4, "a", Some("quota"), Some(10)),
                row(5, "b", Some("unknown"), None),
                row(6, "b", None, Some(3_000)),
                row(7, "c", Some("rate_limit"), Some(1_000)),
            ] {
                s.insert_attempt(&a, &fence()).await.unwrap();
            }
            let failures = s.recent_failures_by_pool(1_000).await.unwrap();
            assert_eq!(failures.len(), 2, "{failures:?}");
            assert_eq!(
                failures["a"],
                BTreeMap::from([("capacity".into(), 2), ("outage".into(), 1)])
            );
            assert_eq!(failures["c"], BTreeMap::from([("rate_limit".into(), 1)]));
            assert!(s.recent_failures_by_pool(5_000).await.unwrap().is_empty());
        },
    )
    .await;
}

#[tokio::test]
async fn reopening_keeps_the_data_and_migrates_once() {
    each_backend(
        "reopening_keeps_the_data_and_migrates_once",
        |fx| async move {
            insert(&fx.store, &sandbox("sb-1", "ws", "running", json!({}), 10)).await;
            fx.store
                .insert_credential("ws", "c", "{}", &[1])
                .await
                .unwrap();
            // Two more opens at once: migrations already applied are not applied again.
            let (a, b) = tokio::join!(fx.another(), fx.another());
            assert!(same(
                &a.get_sandbox("sb-1").await.unwrap(),
                &fx.store.get_sandbox("sb-1").await.unwrap()
            ));
            assert_eq!(b.list_credentials().await.unwrap().len(), 1);
            a.close().await;
            assert!(
                a.get_sandbox("sb-1").await.is_err(),
                "a closed store answers errors"
            );
            assert!(b.get_sandbox("sb-1").await.unwrap().is_some());
        },
    )
    .await;
}

#[tokio::test]
async fn an_unreachable_postgres_is_an_error_without_its_password() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let url = DatabaseUrl::parse("postgres://app:hunter2-secret@127.0.0.1:1/sandgate").unwrap();
    let err = Store::open_postgres(&url).await.unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2-secret"), "{shown}");
    assert!(
        shown.contains("postgres://app:***@127.0.0.1:1/sandgate"),
        "{shown}"
    );
}

#[tokio::test]
async fn a_wrong_password_is_an_error_without_the_password() {
    let Some(server) =
        postgres::server_or_skip("a_wrong_password_is_an_error_without_the_password")
    else {
        return;
    };
    let mut wrong = url::Url::parse(server.expose()).unwrap();
    wrong.set_password(Some("not-the-password-42")).unwrap();
    let wrong = DatabaseUrl::parse(wrong.as_str()).unwrap();
    let err = Store::open_postgres(&wrong).await.unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("not-the-password-42"), "{shown}");
    // And a store that opened shows no password in its `Debug` form.
    let db = TestDatabase::create(&server, "debug_hides_password").await;
    let store = Store::open_postgres(&db.url).await.unwrap();
    let shown = format!("{store:?} {}", store.location());
    if let Some(password) = url::Url::parse(server.expose()).unwrap().password() {
        assert!(!shown.contains(&format!(":{password}@")), "{shown}");
    }
    store.close().await;
    db.drop().await;
}
