//! Per-pool circuit breakers, shared by every create this process drives.
//!
//! Retries within one attempt are capped and back off (see `Coordinator::try_pool`), but a
//! provider that is down would still take every concurrent create's first call and its
//! retries. The circuit remembers, per pool, how many create calls failed in a row:
//! - **closed**: creates call the provider; `[create] circuit_failure_threshold` consecutive
//!   failures open it;
//! - **open**: creates skip the pool at once (their attempt records `circuit_open`) for
//!   `[create] circuit_open_ms`;
//! - **half-open**: then one create is let through as a probe while the others still skip; its
//!   success closes the circuit, its failure opens it again for another `circuit_open_ms`.
//!
//! Only answers that say the provider itself is failing count (`outage`, `provider_error`,
//! `rate_limit`, `unknown`); any other answer (capacity, a refusal, a success) shows the
//! provider is answering and resets the count. State is in memory, per process: a replica
//! that restarts starts closed, which costs at most `circuit_failure_threshold` calls.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::base::clock::now_ms;
use crate::providers::ErrorClass;

/// Whether a failure of this class is the provider's own (counts toward opening).
pub fn counts(class: ErrorClass) -> bool {
    matches!(
        class,
        ErrorClass::Outage
            | ErrorClass::ProviderError
            | ErrorClass::RateLimit
            | ErrorClass::Unknown
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

/// A pool's circuit as `GET /v1/pools` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CircuitView {
    pub state: CircuitState,
    /// Create calls that failed in a row (reset by any other answer).
    pub consecutive_failures: u32,
    /// When it last opened (Unix milliseconds); `null` when closed.
    pub opened_ms: Option<i64>,
    /// When an open circuit lets one probe through (Unix milliseconds); `null` unless open.
    pub half_open_at_ms: Option<i64>,
    /// The failure that opened it, or the last one counted (`class: message`).
    pub last_failure: Option<String>,
}

/// What a create may do on a pool now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permit {
    /// Call the provider (retries allowed while the circuit stays closed).
    Closed,
    /// Call the provider once, as the half-open probe; no retries.
    Probe,
    /// Skip the pool: why, for the attempt record.
    Open(String),
}

#[derive(Debug, Default)]
struct Pool {
    failures: u32,
    /// Set while open (and half-open): when it opened.
    opened: Option<(Instant, i64)>,
    /// A probe let through and not yet reported, and when (a probe that never reports, its
    /// create dropped, is given up after `open_for`).
    probe: Option<Instant>,
    last_failure: Option<String>,
}

pub struct Circuits {
    threshold: u32,
    open_for: Duration,
    pools: Mutex<HashMap<String, Pool>>,
}

impl Circuits {
    /// `threshold` 0 turns the breaker off (every permit is `Closed`).
    pub fn new(threshold: u32, open_for: Duration) -> Circuits {
        Circuits {
            threshold,
            open_for,
            pools: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pool>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a create may call `pool` now. A `Probe` must be followed by [`Circuits::record`].
    pub fn permit(&self, pool: &str) -> Permit {
        if self.threshold == 0 {
            return Permit::Closed;
        }
        let mut pools = self.lock();
        let p = pools.entry(pool.to_string()).or_default();
        let Some((opened, _)) = p.opened else {
            return Permit::Closed;
        };
        let now = Instant::now();
        let half_open_at = opened + self.open_for;
        if now < half_open_at {
            let left = half_open_at - now;
            return Permit::Open(format!(
                "not tried: the pool's circuit is open after {} consecutive failed create calls (last: {}); one create is let through in {:.1} s",
                p.failures,
                p.last_failure.as_deref().unwrap_or("-"),
                left.as_secs_f64()
            ));
        }
        match p.probe {
            Some(at) if now < at + self.open_for => Permit::Open(format!(
                "not tried: the pool's circuit is half-open and another create is probing it (last failure: {})",
                p.last_failure.as_deref().unwrap_or("-")
            )),
            _ => {
                p.probe = Some(now);
                Permit::Probe
            }
        }
    }

    /// Whether retries on `pool` may go on: false once its circuit is open (a probe's failure
    /// reopens it, so a probe never retries).
    pub fn closed(&self, pool: &str) -> bool {
        self.threshold == 0 || self.lock().get(pool).is_none_or(|p| p.opened.is_none())
    }

    /// The answer of one create call on `pool`: `Some(failure)` when it counts (see
    /// [`counts`]), `None` for any other answer.
    pub fn record(&self, pool: &str, failure: Option<(ErrorClass, &str)>) {
        if self.threshold == 0 {
            return;
        }
        let mut pools = self.lock();
        let p = pools.entry(pool.to_string()).or_default();
        let probing = p.probe.take().is_some();
        match failure {
            None => {
                if p.opened.is_some() {
                    tracing::info!(pool, "circuit closed: the provider answered again");
                }
                *p = Pool::default();
            }
            Some((class, message)) => {
                p.failures = p.failures.saturating_add(1);
                let message: String = message.chars().take(200).collect();
                p.last_failure = Some(format!("{}: {message}", class.as_str()));
                // A failed probe opens it again; a closed circuit opens at the threshold.
                if probing || (p.opened.is_none() && p.failures >= self.threshold) {
                    tracing::warn!(
                        pool,
                        failures = p.failures,
                        class = class.as_str(),
                        "circuit opened: creates skip the pool"
                    );
                    metrics::counter!("sandgate_pool_circuit_opened_total", "pool" => pool.to_string())
                        .increment(1);
                    p.opened = Some((Instant::now(), now_ms()));
                }
            }
        }
    }

    pub fn view(&self, pool: &str) -> CircuitView {
        let pools = self.lock();
        let Some(p) = pools.get(pool) else {
            return CircuitView {
                state: CircuitState::Closed,
                consecutive_failures: 0,
                opened_ms: None,
                half_open_at_ms: None,
                last_failure: None,
            };
        };
        let (state, opened_ms, half_open_at_ms) = match p.opened {
            None => (CircuitState::Closed, None, None),
            Some((at, ms)) => {
                let half_open_at = ms + self.open_for.as_millis() as i64;
                let state = if at.elapsed() >= self.open_for {
                    CircuitState::HalfOpen
                } else {
                    CircuitState::Open
                };
                (state, Some(ms), Some(half_open_at))
            }
        };
        CircuitView {
            state,
            consecutive_failures: p.failures,
            opened_ms,
            half_open_at_ms,
            last_failure: p.last_failure.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAIL: Option<(ErrorClass, &str)> = Some((ErrorClass::ProviderError, "500"));

    #[test]
    fn opens_at_the_threshold_probes_once_and_closes_on_success() {
        let c = Circuits::new(3, Duration::from_millis(50));
        for _ in 0..2 {
            assert_eq!(c.permit("p"), Permit::Closed);
            c.record("p", FAIL);
        }
        assert!(c.closed("p"));
        c.record("p", FAIL);
        assert!(!c.closed("p"));
        assert!(matches!(c.permit("p"), Permit::Open(_)));
        assert_eq!(c.view("p").state, CircuitState::Open);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.view("p").state, CircuitState::HalfOpen);
        assert_eq!(c.permit("p"), Permit::Probe);
        assert!(
            matches!(c.permit("p"), Permit::Open(_)),
            "one probe at a time"
        );
        c.record("p", FAIL);
        assert!(
            matches!(c.permit("p"), Permit::Open(_)),
            "a failed probe reopens"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.permit("p"), Permit::Probe);
        c.record("p", None);
        assert_eq!(c.permit("p"), Permit::Closed);
        assert_eq!(c.view("p").consecutive_failures, 0);
        // Another pool is not affected; a threshold of 0 turns the breaker off.
        assert_eq!(c.permit("q"), Permit::Closed);
        let off = Circuits::new(0, Duration::from_secs(1));
        for _ in 0..10 {
            off.record("p", FAIL);
        }
        assert_eq!(off.permit("p"), Permit::Closed);
    }

    #[test]
    fn an_answer_that_is_not_the_providers_failure_resets_the_count() {
        let c = Circuits::new(2, Duration::from_secs(60));
        c.record("p", FAIL);
        c.record("p", None);
        c.record("p", FAIL);
        assert_eq!(c.permit("p"), Permit::Closed);
        assert!(counts(ErrorClass::Outage) && !counts(ErrorClass::Capacity));
    }
}
