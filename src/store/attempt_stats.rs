//! Aggregates over creation attempts, for `GET /v1/pools`: how often each pool failed, and
//! why, within the stats window.

use std::collections::{BTreeMap, HashMap};

use super::{Store, StoreError, StoreRow};

/// Failed attempts of one pool, keyed by error class (`capacity`, `rate_limit`, ...).
pub type FailuresByClass = BTreeMap<String, u64>;

impl Store {
    /// Attempts that ended with an error class at or after `since_ms`, counted per pool and
    /// class. Pools without such attempts are absent. Attempts still in flight (no
    /// `finished_ms`) and successes (no class) are not counted. Aggregated in SQL, so the
    /// answer's size is pools × classes whatever the number of attempts.
    pub async fn recent_failures_by_pool(
        &self,
        since_ms: i64,
    ) -> Result<HashMap<String, FailuresByClass>, StoreError> {
        const SQL: &str = "SELECT pool, error_class, COUNT(*) AS n FROM attempts
             WHERE error_class IS NOT NULL AND finished_ms IS NOT NULL AND finished_ms >= $1
             GROUP BY pool, error_class";
        let mut out: HashMap<String, FailuresByClass> = HashMap::new();
        with_pool!(self, pool => {
            for r in sqlx::query(SQL).bind(since_ms).fetch_all(pool).await? {
                let n: i64 = r.col("n")?;
                out.entry(r.col("pool")?)
                    .or_default()
                    .insert(r.col("error_class")?, n.max(0) as u64);
            }
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sandboxes::AttemptRow;

    fn attempt(seq: i64, pool: &str, class: Option<&str>, finished: Option<i64>) -> AttemptRow {
        AttemptRow {
            id: format!("sb-1-{seq}"),
            sandbox_id: "sb-1".into(),
            seq,
            pool: pool.into(),
            provider: "sim".into(),
            account: "acct".into(),
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
            message: None,
            instance_id: None,
            started_ms: 0,
            finished_ms: finished,
        }
    }

    #[tokio::test]
    async fn counts_classified_attempts_per_pool_within_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("db")).await.unwrap();
        let rows = [
            attempt(1, "a", Some("capacity"), Some(1_000)),
            attempt(2, "a", Some("capacity"), Some(2_000)),
            attempt(3, "a", Some("outage"), Some(2_000)),
            // Before the window: not counted.
            attempt(4, "a", Some("quota"), Some(10)),
            // Still in flight: not counted.
            attempt(5, "b", Some("unknown"), None),
            // A success: no class.
            attempt(6, "b", None, Some(3_000)),
            attempt(7, "c", Some("rate_limit"), Some(1_000)),
        ];
        for row in &rows {
            store.insert_attempt(row).await.unwrap();
        }
        let failures = store.recent_failures_by_pool(1_000).await.unwrap();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert_eq!(
            failures["a"],
            BTreeMap::from([("capacity".into(), 2), ("outage".into(), 1)])
        );
        assert_eq!(failures["c"], BTreeMap::from([("rate_limit".into(), 1)]));
        assert!(store
            .recent_failures_by_pool(5_000)
            .await
            .unwrap()
            .is_empty());
    }
}
