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

// Tested on both backends by tests/it/store.rs (recent_failures_counted_per_pool_and_class).
