//! Waiting for a provider-side state: one polling loop for every hosted adapter.
//!
//! Contract:
//! - [`until`] looks at what the provider last answered with the adapter's `judge`, which
//!   says ready (done), keep waiting (naming the state, for the timeout's message) or stop
//!   (a terminal state, a vanished instance: the adapter's own error). Between looks it
//!   sleeps by its [`Pace`], never past the deadline, and fetches again with `fetch`; a
//!   failed fetch stops the wait with that error.
//! - Nothing is retried here: `fetch` is normally an idempotent GET that
//!   `ProviderHttp::send_idempotent` already retries.
//! - A wait that reaches its deadline answers [`Waited::TimedOut`] with the last state seen.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long to sleep between looks: from `first`, multiplied by `grow_num / grow_den` after
/// each look, up to `max`.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub first: Duration,
    pub grow_num: u32,
    pub grow_den: u32,
    pub max: Duration,
}

impl Pace {
    /// The same sleep every time.
    pub const fn every(interval: Duration) -> Pace {
        Pace {
            first: interval,
            grow_num: 1,
            grow_den: 1,
            max: interval,
        }
    }

    /// From `first`, half as long again each time, up to `max`.
    pub const fn growing(first: Duration, max: Duration) -> Pace {
        Pace {
            first,
            grow_num: 3,
            grow_den: 2,
            max,
        }
    }

    fn next(&self, now: Duration) -> Duration {
        (now * self.grow_num / self.grow_den).min(self.max)
    }
}

/// What the adapter makes of one answer.
pub enum Seen<T, E> {
    /// The wanted state: the wait is over.
    Ready(T),
    /// Not there yet; the state as the provider names it.
    Waiting(String),
    /// A state the wanted one cannot follow, or the instance is gone.
    Stop(E),
}

/// Why a wait ended without its state.
#[derive(Debug)]
pub enum Waited<E> {
    /// `judge` stopped it, or a fetch failed.
    Stopped(E),
    /// The deadline passed; the last state seen.
    TimedOut(String),
}

/// Polls until `judge` says ready or stop, or `deadline` passes. `first` is an answer the
/// caller already has (a create's or a transition's); without one, the first look fetches.
pub async fn until<S, T, E, Fut>(
    deadline: Instant,
    pace: Pace,
    first: Option<S>,
    mut judge: impl FnMut(S) -> Seen<T, E>,
    mut fetch: impl FnMut() -> Fut,
) -> Result<T, Waited<E>>
where
    Fut: Future<Output = Result<S, E>>,
{
    let mut current = match first {
        Some(answer) => answer,
        None => fetch().await.map_err(Waited::Stopped)?,
    };
    let mut sleep = pace.first;
    loop {
        let state = match judge(current) {
            Seen::Ready(done) => return Ok(done),
            Seen::Stop(e) => return Err(Waited::Stopped(e)),
            Seen::Waiting(state) => state,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Waited::TimedOut(state));
        }
        tokio::time::sleep(sleep.min(deadline - now)).await;
        sleep = pace.next(sleep);
        current = fetch().await.map_err(Waited::Stopped)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_the_state_and_stops_at_the_deadline() {
        let mut answers = vec!["running", "starting"];
        let judge = |s: &str| match s {
            "running" => Seen::Ready(()),
            "failed" => Seen::Stop("failed"),
            other => Seen::Waiting(other.to_string()),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let pace = Pace::every(Duration::from_millis(1));
        let fetch = || {
            let next = answers.pop().unwrap_or("failed");
            async move { Ok::<_, &str>(next) }
        };
        assert!(until(deadline, pace, None, judge, fetch).await.is_ok());
        let r = until(Instant::now(), pace, Some("starting"), judge, || async {
            Ok("starting")
        })
        .await;
        assert!(matches!(r, Err(Waited::TimedOut(s)) if s == "starting"));
        let r = until(deadline, pace, Some("failed"), judge, || async { Ok("x") }).await;
        assert!(matches!(r, Err(Waited::Stopped("failed"))));
        assert_eq!(
            Pace::growing(Duration::from_millis(200), Duration::from_secs(2))
                .next(Duration::from_millis(200)),
            Duration::from_millis(300)
        );
    }
}
