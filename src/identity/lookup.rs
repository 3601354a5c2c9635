//! Looking up, in the store, a sandbox identity this replica does not serve yet.
//!
//! A sandbox created through replica A reaches replica B's memory through the change feed
//! (`crate::propagation`), which takes a moment: a NOTIFY, a read, a registration. A client
//! that sends the sandbox's first proxy request to B right after A's `201` could arrive
//! first and be refused (407) although the sandbox exists. So before refusing an id it does
//! not know, the proxy asks the store once ([`Lookup::look_up`]); when the sandbox is live
//! there, its identity is registered (as the follower would register it) and the request's
//! token is checked against it like any other.
//!
//! Unknown ids are what an attacker sends, so the lookups are bounded, and a refusal never
//! waits on more than one of them:
//! - only ids of the shape sandgate gives sandboxes (`sb-` and hex) are looked up;
//! - at most [`RATE_PER_SEC`] lookups a second per replica (a bucket of [`BURST`]); beyond it
//!   the id is refused without one (`limited`);
//! - at most [`CONCURRENT`] at once; a lookup that does not answer within [`TIMEOUT`] is
//!   given up (the request is refused) while it still holds its slot;
//! - an id found absent is remembered for [`ABSENT_FOR`] (at most [`ABSENT_MAX`] ids), so a
//!   deleted sandbox that keeps retrying costs no reads and does not use up the budget. The
//!   follower's registrations do not look at this list: it only spares the store.
//!
//! The lookup runs on the runtime that owns the store's pool (the proxy workers run their
//! own runtimes; a connection opened on one of them would die with it).
//!
//! Metric: `sandgate_identity_lookups_total{outcome}`, outcome `found`, `absent`,
//! `limited` or `failed`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Sustained lookups a second.
pub const RATE_PER_SEC: f64 = 20.0;
/// Lookups that may run back to back before the rate applies.
pub const BURST: f64 = 40.0;
/// Lookups running at once.
pub const CONCURRENT: usize = 4;
/// How long a refusal waits for its lookup at most.
pub const TIMEOUT: Duration = Duration::from_secs(1);
/// How long an id found absent is not looked up again.
pub const ABSENT_FOR: Duration = Duration::from_secs(2);
/// Ids remembered as absent at most.
pub const ABSENT_MAX: usize = 4096;

/// What a lookup reports: whether the store read ran (`Ok`) and failed or not. The read
/// registers the identity itself when the sandbox is live.
pub type Found = Pin<Box<dyn Future<Output = Result<bool, String>> + Send>>;

/// Reads one sandbox id from the store and registers its identity when it is live; answers
/// whether this replica serves it now.
pub type Finder = Arc<dyn Fn(String) -> Found + Send + Sync>;

/// How a lookup ended (its metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The identity is served now.
    Found,
    /// Not a live sandbox (or not a sandbox id, or found absent a moment ago).
    Absent,
    /// Over the rate or the concurrency bound: refused without a lookup.
    Limited,
    /// The store did not answer (in time).
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Found => "found",
            Outcome::Absent => "absent",
            Outcome::Limited => "limited",
            Outcome::Failed => "failed",
        }
    }
}

struct Budget {
    tokens: f64,
    refilled: Instant,
    absent: HashMap<String, Instant>,
}

/// The bounded store lookup of unknown identities (see the module documentation).
pub struct Lookup {
    find: Finder,
    runtime: tokio::runtime::Handle,
    budget: Mutex<Budget>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookup")
            .field(
                "in_flight",
                &(CONCURRENT - self.in_flight.available_permits()),
            )
            .finish()
    }
}

/// Whether `id` has the shape of a sandbox id (`sb-` and 24 hex digits today; any length up
/// to 64 is accepted so that a later id length still works).
fn is_sandbox_id(id: &str) -> bool {
    id.strip_prefix("sb-").is_some_and(|rest| {
        !rest.is_empty() && rest.len() <= 61 && rest.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

impl Lookup {
    /// Lookups through `find`, run on `runtime` (the one that owns the store's pool).
    pub fn new(find: Finder, runtime: tokio::runtime::Handle) -> Lookup {
        Lookup {
            find,
            runtime,
            budget: Mutex::new(Budget {
                tokens: BURST,
                refilled: Instant::now(),
                absent: HashMap::new(),
            }),
            in_flight: Arc::new(tokio::sync::Semaphore::new(CONCURRENT)),
        }
    }

    /// Looks `id` up in the store, within the bounds; on [`Outcome::Found`] the identity is
    /// registered (the caller checks the token against it as usual).
    pub async fn look_up(&self, id: &str) -> Outcome {
        let outcome = self.look_up_bounded(id).await;
        metrics::counter!("sandgate_identity_lookups_total", "outcome" => outcome.label())
            .increment(1);
        outcome
    }

    async fn look_up_bounded(&self, id: &str) -> Outcome {
        if !is_sandbox_id(id) {
            return Outcome::Absent;
        }
        if let Some(refused) = self.admit(id) {
            return refused;
        }
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            return Outcome::Limited;
        };
        let read = (self.find)(id.to_string());
        // The slot is held by the read itself, so one given up on still counts until it ends.
        let task = self.runtime.spawn(async move {
            let _slot = permit;
            read.await
        });
        match tokio::time::timeout(TIMEOUT, task).await {
            Ok(Ok(Ok(true))) => Outcome::Found,
            Ok(Ok(Ok(false))) => {
                self.remember_absent(id);
                Outcome::Absent
            }
            Ok(Ok(Err(e))) => {
                tracing::warn!(sandbox = %id, error = %e, "could not look up an unknown proxy identity");
                Outcome::Failed
            }
            Ok(Err(_)) | Err(_) => {
                tracing::warn!(sandbox = %id, "the lookup of an unknown proxy identity did not answer in time");
                Outcome::Failed
            }
        }
    }

    /// Takes one lookup from the budget; otherwise the answer without one: `Absent` when `id`
    /// was found absent a moment ago, `Limited` when the rate is spent.
    fn admit(&self, id: &str) -> Option<Outcome> {
        let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if budget
            .absent
            .get(id)
            .is_some_and(|at| now.duration_since(*at) < ABSENT_FOR)
        {
            return Some(Outcome::Absent);
        }
        let elapsed = now.duration_since(budget.refilled).as_secs_f64();
        budget.tokens = (budget.tokens + elapsed * RATE_PER_SEC).min(BURST);
        budget.refilled = now;
        if budget.tokens < 1.0 {
            return Some(Outcome::Limited);
        }
        budget.tokens -= 1.0;
        None
    }

    fn remember_absent(&self, id: &str) {
        let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if budget.absent.len() >= ABSENT_MAX {
            budget
                .absent
                .retain(|_, at| now.duration_since(*at) < ABSENT_FOR);
            if budget.absent.len() >= ABSENT_MAX {
                // Still full of fresh entries: forgetting them costs at most more lookups,
                // which the rate bounds anyway.
                budget.absent.clear();
            }
        }
        budget.absent.insert(id.to_string(), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting(found: bool) -> (Finder, Arc<AtomicUsize>) {
        let reads = Arc::new(AtomicUsize::new(0));
        let counter = reads.clone();
        let find: Finder = Arc::new(move |_id| {
            counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(found) })
        });
        (find, reads)
    }

    #[tokio::test]
    async fn only_sandbox_ids_are_looked_up_and_absent_ones_are_remembered() {
        let (find, reads) = counting(false);
        let lookup = Lookup::new(find, tokio::runtime::Handle::current());
        assert_eq!(lookup.look_up("admin").await, Outcome::Absent);
        assert_eq!(lookup.look_up("sb-../etc").await, Outcome::Absent);
        assert_eq!(reads.load(Ordering::SeqCst), 0);
        assert_eq!(lookup.look_up("sb-00ff").await, Outcome::Absent);
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        // Asked again at once: answered from memory.
        assert_eq!(lookup.look_up("sb-00ff").await, Outcome::Absent);
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_flood_of_unknown_ids_reads_the_store_at_most_the_burst() {
        let (find, reads) = counting(false);
        let lookup = Lookup::new(find, tokio::runtime::Handle::current());
        let mut limited = 0;
        for i in 0..1000 {
            if lookup.look_up(&format!("sb-{i:024x}")).await == Outcome::Limited {
                limited += 1;
            }
        }
        // The same ids again: remembered as absent, so no read and no budget either.
        for i in 0..10 {
            assert_eq!(
                lookup.look_up(&format!("sb-{i:024x}")).await,
                Outcome::Absent
            );
        }
        let read = reads.load(Ordering::SeqCst);
        // The burst, plus what the rate refilled while the loop ran (well under a second).
        assert!(read <= BURST as usize + 20, "{read} reads");
        assert_eq!(read + limited, 1000);
    }

    #[tokio::test]
    async fn a_live_sandbox_is_found() {
        let (find, _) = counting(true);
        let lookup = Lookup::new(find, tokio::runtime::Handle::current());
        assert_eq!(lookup.look_up("sb-0123abcd").await, Outcome::Found);
    }
}
