//! Postgres for tests: the server `SANDGATE_TEST_POSTGRES_URL` names (a role that may
//! create databases), and a fresh database per test, created and dropped by the test, so
//! tests run in parallel without seeing each other's rows. `.ci/run` starts a local server
//! and sets the variable; under CI a missing variable fails the test instead of skipping it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sandgate::store::DatabaseUrl;
use sqlx::Connection;

/// The variable naming the test server, e.g. `postgres://sandgate_test:pw@127.0.0.1:5432/sandgate_test`.
pub const URL_ENV: &str = "SANDGATE_TEST_POSTGRES_URL";

/// The Postgres server tests use, or `None` when they are skipped here (the skip line is
/// printed). Under CI (see [`super::in_ci`]) a missing or invalid variable panics: a green
/// CI run must mean the Postgres variants ran.
pub fn server_or_skip(test: &str) -> Option<DatabaseUrl> {
    match verdict(test, std::env::var(URL_ENV).ok(), super::in_ci()) {
        Ok(url) => url,
        Err(message) => panic!("{message}"),
    }
}

/// What [`server_or_skip`] decides: `Ok(Some)` run on that server, `Ok(None)` skipped (with
/// the line printed), `Err` when CI would otherwise skip, or the URL is unusable.
pub fn verdict(test: &str, url: Option<String>, ci: bool) -> Result<Option<DatabaseUrl>, String> {
    match url.filter(|u| !u.trim().is_empty()) {
        Some(text) => DatabaseUrl::parse(text.trim())
            .map(Some)
            .map_err(|e| format!("{test}: {URL_ENV} is not a usable Postgres URL: {e}")),
        None if ci => Err(format!(
            "{test} needs Postgres and CI must not skip it: set {URL_ENV} to a role that may \
             create databases (.ci/run starts a local server and sets it)"
        )),
        None => {
            eprintln!("SKIPPED {test} on Postgres: {URL_ENV} is not set");
            Ok(None)
        }
    }
}

/// A database created for one test on the test server; [`TestDatabase::drop`] removes it.
pub struct TestDatabase {
    server: DatabaseUrl,
    name: String,
    /// The new database's URL (the server's credentials).
    pub url: DatabaseUrl,
}

impl TestDatabase {
    /// Creates an empty database named after `test`, unique in this run.
    pub async fn create(server: &DatabaseUrl, test: &str) -> TestDatabase {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let slug: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        // At most 63 bytes (Postgres' identifier limit): 5 + 30 + 1 + 10 + 1 + 5 + 1 + 8.
        let name = format!(
            "sgtst{slug}_{}_{}_{nanos:08x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = sqlx::PgConnection::connect(server.expose())
            .await
            .unwrap_or_else(|e| panic!("connect to {server}: {e}"));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("create database {name} on {server}: {e}"));
        let _ = admin.close().await;
        TestDatabase {
            url: server.with_database(&name),
            server: server.clone(),
            name,
        }
    }

    /// The database's name on the server.
    #[allow(dead_code)]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops the database, closing whatever connections still use it.
    pub async fn drop(self) {
        let mut admin = match sqlx::PgConnection::connect(self.server.expose()).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("could not drop test database {}: {e}", self.name);
                return;
            }
        };
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
        {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
        let _ = admin.close().await;
    }
}
