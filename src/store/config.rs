//! `[store]`, owned by the store: which database, how replicas follow each other's writes,
//! how long a request waits for a connection.

use std::path::PathBuf;

use serde::Deserialize;

use crate::base::ConfigError;

/// `[store]`: where durable state lives. SQLite at `path` is the embedded default; `url`
/// selects Postgres instead (shared by replicas). Setting both is refused, as is
/// `synchronous` with `url` (it is a SQLite setting): a file that names two stores must
/// not silently use one of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "StoreToml")]
pub struct StoreConfig {
    /// SQLite database file (created with its directory on first start).
    pub path: PathBuf,
    /// SQLite `synchronous`: `full` (the default) makes every committed write durable
    /// before it is acknowledged, so a power loss cannot drop the attempt rows that keep a
    /// create idempotent; `normal` may lose the last commits on power loss (not on a crash).
    pub synchronous: super::Durability,
    /// `postgres://user:password@host:port/database`: use Postgres instead of SQLite. Its
    /// password never appears in logs, errors or `Debug` output (see `DatabaseUrl`).
    pub url: Option<super::DatabaseUrl>,
    /// How often a replica reads the change feed for other replicas' writes (new sandboxes'
    /// identities, deletes, credential changes; see `crate::propagation`). On Postgres a
    /// NOTIFY wakes it at once and this is the fallback; on SQLite it is the delay.
    pub poll_changes_ms: u64,
    /// How often a replica compares everything it holds in memory with the store, repairing
    /// what a missed change left behind. 0 turns it off.
    pub reconcile_secs: u64,
    /// Postgres: how long a request waits for a connection from the pool before it is
    /// answered 503 `store_unavailable` (retryable). While the database is unreachable every
    /// wait runs to this bound, so it is what a client waits during an outage.
    pub acquire_timeout_ms: u64,
    /// Which SQLite keys the file set (rather than left to their defaults), to refuse them
    /// next to `url`.
    sqlite_keys_set: Vec<&'static str>,
}

/// `[store]` as written in the file: which keys are set.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct StoreToml {
    path: Option<PathBuf>,
    synchronous: Option<super::Durability>,
    url: Option<super::DatabaseUrl>,
    poll_changes_ms: Option<u64>,
    reconcile_secs: Option<u64>,
    acquire_timeout_ms: Option<u64>,
}

impl From<StoreToml> for StoreConfig {
    fn from(t: StoreToml) -> Self {
        let defaults = StoreConfig::default();
        let mut sqlite_keys_set = Vec::new();
        if t.path.is_some() {
            sqlite_keys_set.push("store.path");
        }
        if t.synchronous.is_some() {
            sqlite_keys_set.push("store.synchronous");
        }
        StoreConfig {
            path: t.path.unwrap_or(defaults.path),
            synchronous: t.synchronous.unwrap_or(defaults.synchronous),
            url: t.url,
            poll_changes_ms: t.poll_changes_ms.unwrap_or(defaults.poll_changes_ms),
            reconcile_secs: t.reconcile_secs.unwrap_or(defaults.reconcile_secs),
            acquire_timeout_ms: t.acquire_timeout_ms.unwrap_or(defaults.acquire_timeout_ms),
            sqlite_keys_set,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: PathBuf::from("data/sandgate.db"),
            synchronous: super::Durability::Full,
            url: None,
            poll_changes_ms: 250,
            reconcile_secs: 30,
            acquire_timeout_ms: 2000,
            sqlite_keys_set: Vec::new(),
        }
    }
}

impl StoreConfig {
    /// A Postgres store at `url` (the SQLite keys at their defaults).
    pub fn postgres(url: super::DatabaseUrl) -> StoreConfig {
        StoreConfig {
            url: Some(url),
            ..StoreConfig::default()
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.url.is_some() {
            if let Some(key) = self.sqlite_keys_set.first() {
                return Err(ConfigError::invalid(
                    "store.url",
                    format!(
                        "store.url (Postgres) and {key} (SQLite) are both set: set one store, url or path"
                    ),
                ));
            }
        }
        // Zero would be a busy loop against the database.
        if !(10..=60_000).contains(&self.poll_changes_ms) {
            return Err(ConfigError::invalid(
                "store.poll_changes_ms",
                "must be between 10 and 60000",
            ));
        }
        // Below 100 ms a healthy but busy pool would refuse requests; above a minute a client
        // is held far longer than it would wait.
        if !(100..=60_000).contains(&self.acquire_timeout_ms) {
            return Err(ConfigError::invalid(
                "store.acquire_timeout_ms",
                "must be between 100 and 60000",
            ));
        }
        Ok(())
    }
}
