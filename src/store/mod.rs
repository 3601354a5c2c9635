//! Durable state on one of two backends behind the same methods: SQLite, the embedded
//! default (one file, WAL), or Postgres (`[store] url`), which replicas share. Each backend
//! has its own migrations (`migrations/` and `migrations/postgres/`, same numbering and
//! meaning), applied at open. Callers use `Store`'s methods only, never SQL.
//!
//! How the two backends share code: every statement is written once with `$N` placeholders,
//! which both drivers accept (sqlx's SQLite driver maps `$N` to argument N, as Postgres
//! does), and [`with_pool!`] expands a method's query, binds and row mapping once per
//! backend, so each arm is type-checked against its own driver. Where the dialects differ
//! (JSON functions, the clock), the method picks between two texts kept side by side, so
//! they are reviewed together.

/// Runs `$body` with `$pool` bound to the pool behind `$store` (a `&SqlitePool` or a
/// `&PgPool`). The body is expanded once per backend: the same statement text and bind
/// chain, compiled against each driver.
macro_rules! with_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.backend {
            $crate::store::Backend::Sqlite($pool) => $body,
            $crate::store::Backend::Postgres($pool) => $body,
        }
    };
}

pub mod attempt_stats;
pub mod changes;
mod config;
pub mod delegations;
pub mod replicas;
pub mod sandboxes;
pub mod sealed;
pub mod snapshots;
mod url;

pub use config::StoreConfig;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::Row;

pub use url::DatabaseUrl;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened; `path` is the SQLite file or the Postgres URL with
    /// its password redacted.
    #[error("database {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("database migration failed: {0}")]
    Migrate(String),
    #[error("database error: {0}")]
    Query(#[from] sqlx::Error),
    /// A create's write found its lease held by another coordinator (or a later epoch of
    /// this one): the writer lost the create and must stop (see `sandboxes::Fence`).
    #[error("the lease on sandbox {sandbox_id} is no longer this coordinator's")]
    Fenced { sandbox_id: String },
}

/// How long a request waits for a Postgres connection unless `[store] acquire_timeout_ms`
/// says otherwise.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_millis(2000);

impl StoreError {
    /// Whether the database could not be reached (rather than refusing or failing the
    /// statement): no connection within the acquire timeout, a connection cut, or the server
    /// shutting down or refusing new sessions. Nothing was committed by the failed call, so the
    /// client may retry; the API answers 503 `store_unavailable` for these, not `internal`.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Query(e) => sqlx_unavailable(e),
            _ => false,
        }
    }
}

fn sqlx_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE class 08 (connection exception), 57P01-57P03 (admin or crash shutdown,
        // cannot connect now), 53300 (too many connections).
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

/// How durable a committed write is before it is acknowledged (SQLite `synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Synced to disk at every commit: a power loss loses nothing acknowledged.
    Full,
    /// Synced at checkpoints (WAL): a power loss may drop the last commits.
    Normal,
}

/// Which SQL dialect a statement must be written in, where the two differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// The pool behind a [`Store`]. Crate-visible only for [`with_pool!`].
#[derive(Clone)]
pub(crate) enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Durable state. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct Store {
    pub(crate) backend: Backend,
    /// Where the data lives, for messages: the SQLite path or the redacted Postgres URL.
    location: Arc<str>,
    /// The replica writing through this store, recorded with every change it makes (see
    /// [`changes`]) so that it skips its own. Empty until [`Store::with_origin`].
    origin: Arc<str>,
}

impl fmt::Debug for Store {
    // Written out (not derived) because sqlx's Postgres options print the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("dialect", &self.dialect())
            .field("location", &self.location)
            .finish()
    }
}

pub struct CredentialRow {
    pub workspace: String,
    pub name: String,
    pub meta_json: String,
    pub sealed: Vec<u8>,
    pub version: i64,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
static PG_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A column read from a row of either backend, by name. Decoding errors are returned (a
/// column of an unexpected type is an error, never a panic).
pub(crate) trait StoreRow {
    fn col<T: Column>(&self, name: &str) -> Result<T, sqlx::Error>;
}

/// The Rust types the store reads from columns, decodable on both backends.
pub(crate) trait Column: Sized {
    fn from_sqlite(row: &SqliteRow, name: &str) -> Result<Self, sqlx::Error>;
    fn from_postgres(row: &PgRow, name: &str) -> Result<Self, sqlx::Error>;
}

macro_rules! columns {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn from_sqlite(row: &SqliteRow, name: &str) -> Result<Self, sqlx::Error> {
                row.try_get(name)
            }
            fn from_postgres(row: &PgRow, name: &str) -> Result<Self, sqlx::Error> {
                row.try_get(name)
            }
        }
    )*};
}
columns!(
    String,
    Option<String>,
    i64,
    Option<i64>,
    f64,
    Option<f64>,
    Vec<u8>,
    Option<Vec<u8>>
);

impl StoreRow for SqliteRow {
    fn col<T: Column>(&self, name: &str) -> Result<T, sqlx::Error> {
        T::from_sqlite(self, name)
    }
}

impl StoreRow for PgRow {
    fn col<T: Column>(&self, name: &str) -> Result<T, sqlx::Error> {
        T::from_postgres(self, name)
    }
}

fn credential_row(r: &impl StoreRow) -> Result<CredentialRow, sqlx::Error> {
    Ok(CredentialRow {
        workspace: r.col("workspace")?,
        name: r.col("name")?,
        meta_json: r.col("meta_json")?,
        sealed: r.col("sealed")?,
        version: r.col("version")?,
    })
}

impl Store {
    /// Opens the store `[store]` configures: Postgres when `url` is set, else the SQLite
    /// file at `path`. Either way the schema is migrated to the current version first.
    pub async fn open(config: &StoreConfig) -> Result<Store, StoreError> {
        match &config.url {
            Some(url) => {
                Store::open_postgres_with(url, Duration::from_millis(config.acquire_timeout_ms))
                    .await
            }
            None => Store::open_sqlite_with(&config.path, config.synchronous).await,
        }
    }

    /// Opens (creating) the database with `synchronous=FULL`.
    pub async fn open_sqlite(path: &Path) -> Result<Store, StoreError> {
        Store::open_sqlite_with(path, Durability::Full).await
    }

    pub async fn open_sqlite_with(
        path: &Path,
        durability: Durability,
    ) -> Result<Store, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.display().to_string(),
            reason,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| open_err(e.to_string()))?;
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(|e| open_err(e.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                Durability::Full => SqliteSynchronous::Full,
                Durability::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StoreError::Migrate(e.to_string()))?;
        Ok(Store {
            backend: Backend::Sqlite(pool),
            location: path.display().to_string().into(),
            origin: "".into(),
        })
    }

    /// The same store, writing as replica `origin` (see [`changes`]).
    pub fn with_origin(mut self, origin: &str) -> Store {
        self.origin = origin.into();
        self
    }

    /// One round trip to the database (`GET /readyz`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_pool!(self, pool => sqlx::query("SELECT 1").execute(pool).await?.rows_affected());
        Ok(())
    }

    /// Connects to Postgres and applies `migrations/postgres/` (sqlx takes an advisory lock
    /// for it, so replicas starting together migrate once). Errors show the URL redacted and
    /// are scrubbed of its password.
    pub async fn open_postgres(url: &DatabaseUrl) -> Result<Store, StoreError> {
        Store::open_postgres_with(url, DEFAULT_ACQUIRE_TIMEOUT).await
    }

    /// [`Store::open_postgres`], waiting at most `acquire_timeout` for a connection.
    pub async fn open_postgres_with(
        url: &DatabaseUrl,
        acquire_timeout: Duration,
    ) -> Result<Store, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: url.redacted(),
            reason: url.scrub(&reason),
        };
        let options = PgConnectOptions::from_str(url.expose())
            .map_err(|e| open_err(e.to_string()))?
            .application_name("sandgate")
            // READ COMMITTED whatever the server's or database's default: the store's
            // transactions rely on it (`insert_sandbox` reads the key's holder in a later
            // statement, which must see a concurrent claimant's commit; a stricter level
            // would fail the loser with a serialization error instead of answering).
            .options([("default_transaction_isolation", "read committed")]);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            // A store that cannot be reached fails a request promptly (503
            // `store_unavailable`, retryable) rather than holding it for the driver's default
            // 30 s: during an outage every request waits exactly this long.
            .acquire_timeout(acquire_timeout)
            .connect_with(options)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        PG_MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StoreError::Migrate(url.scrub(&e.to_string())))?;
        Ok(Store {
            backend: Backend::Postgres(pool),
            location: url.redacted().into(),
            origin: "".into(),
        })
    }

    /// The backend's dialect, for the statements that differ between them.
    pub fn dialect(&self) -> Dialect {
        match self.backend {
            Backend::Sqlite(_) => Dialect::Sqlite,
            Backend::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Where the data lives: the SQLite file, or the Postgres URL with its password redacted.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Closes the pool's connections (waiting for those in use to be returned). The store
    /// (and its clones) answer errors afterwards.
    pub async fn close(&self) {
        with_pool!(self, pool => pool.close().await)
    }

    pub async fn list_credentials(&self) -> Result<Vec<CredentialRow>, StoreError> {
        const SQL: &str = "SELECT workspace, name, meta_json, sealed, version FROM credentials
             ORDER BY workspace, name";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .fetch_all(pool)
            .await?
            .iter()
            .map(credential_row)
            .collect::<Result<_, _>>()?))
    }

    /// Inserts a new credential; `Ok(None)` when one of that name exists already (a race
    /// between two creates has exactly one winner). Returns the version.
    pub async fn insert_credential(
        &self,
        workspace: &str,
        name: &str,
        meta_json: &str,
        sealed: &[u8],
    ) -> Result<Option<i64>, StoreError> {
        const SQL: &str = "INSERT INTO credentials (workspace, name, meta_json, sealed)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (workspace, name) DO NOTHING
             RETURNING version";
        let version = with_pool!(self, pool => match sqlx::query(SQL)
            .bind(workspace)
            .bind(name)
            .bind(meta_json)
            .bind(sealed)
            .fetch_optional(pool)
            .await?
        {
            Some(r) => Some(r.col::<i64>("version")?),
            None => None,
        });
        if version.is_some() {
            self.record_change(
                changes::CREDENTIAL,
                &changes::credential_key(workspace, name),
            )
            .await?;
        }
        Ok(version)
    }

    /// Inserts or replaces; returns the new version. Two concurrent replacements both
    /// count: the version goes up by two.
    pub async fn upsert_credential(
        &self,
        workspace: &str,
        name: &str,
        meta_json: &str,
        sealed: &[u8],
    ) -> Result<i64, StoreError> {
        // The same ISO-8601 UTC text (millisecond precision) as the column default, from
        // the database's clock.
        let sql = match self.dialect() {
            Dialect::Sqlite => {
                "INSERT INTO credentials (workspace, name, meta_json, sealed) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (workspace, name) DO UPDATE SET meta_json = excluded.meta_json,
                   sealed = excluded.sealed, version = credentials.version + 1,
                   updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                 RETURNING version"
            }
            Dialect::Postgres => {
                "INSERT INTO credentials (workspace, name, meta_json, sealed) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (workspace, name) DO UPDATE SET meta_json = excluded.meta_json,
                   sealed = excluded.sealed, version = credentials.version + 1,
                   updated_at = to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
                 RETURNING version"
            }
        };
        let version: i64 = with_pool!(self, pool => sqlx::query(sql)
            .bind(workspace)
            .bind(name)
            .bind(meta_json)
            .bind(sealed)
            .fetch_one(pool)
            .await?
            .col("version")?);
        self.record_change(
            changes::CREDENTIAL,
            &changes::credential_key(workspace, name),
        )
        .await?;
        Ok(version)
    }

    pub async fn delete_credential(&self, workspace: &str, name: &str) -> Result<bool, StoreError> {
        const SQL: &str = "DELETE FROM credentials WHERE workspace = $1 AND name = $2";
        let affected = with_pool!(self, pool => sqlx::query(SQL)
            .bind(workspace)
            .bind(name)
            .execute(pool)
            .await?
            .rows_affected());
        if affected > 0 {
            self.record_change(
                changes::CREDENTIAL,
                &changes::credential_key(workspace, name),
            )
            .await?;
        }
        Ok(affected > 0)
    }

    /// One credential's row, if it exists.
    pub async fn get_credential(
        &self,
        workspace: &str,
        name: &str,
    ) -> Result<Option<CredentialRow>, StoreError> {
        const SQL: &str = "SELECT workspace, name, meta_json, sealed, version FROM credentials
             WHERE workspace = $1 AND name = $2";
        Ok(with_pool!(self, pool => match sqlx::query(SQL)
            .bind(workspace)
            .bind(name)
            .fetch_optional(pool)
            .await?
        {
            Some(r) => Some(credential_row(&r)?),
            None => None,
        }))
    }
}
