//! Idempotency keys: a create's `Idempotency-Key` names it for `[create]
//! idempotency_ttl_secs`. The same key with the same body answers the same sandbox (never its
//! token again); with another body, a conflict.

use std::time::{Duration, Instant};

use super::{internal, Answer, Coordinator};
use crate::error::{Details, Error, Kind};
use crate::store::sandboxes::{IdempotencyClaim, IN_FLIGHT_STATES};

impl Coordinator {
    /// Looked up when a create (not a dry run) arrives with a key: the body digest and sandbox
    /// the key already names in the workspace, if it is held and has not expired.
    pub(super) async fn held_key(
        &self,
        workspace: &str,
        key: &str,
        now: i64,
    ) -> Result<Option<(String, String)>, Error> {
        self.deps
            .store
            .find_idempotency_key(workspace, key, now)
            .await
            .map_err(internal)
    }

    /// The claim a new create's key makes as its sandbox is inserted (in the same
    /// transaction, so two creates with one key cannot both make a sandbox).
    pub(super) fn claim<'a>(
        &self,
        key: Option<&'a str>,
        digest: &'a str,
        now: i64,
    ) -> Option<IdempotencyClaim<'a>> {
        key.map(|key| IdempotencyClaim {
            key,
            body_hash: digest,
            expires_ms: now + self.deps.config.idempotency_ttl_secs as i64 * 1000,
        })
    }

    /// Same key: the same sandbox, when the body is the same too, without its token (that
    /// was shown once, to the create that made it; see [`Coordinator::respond`]).
    pub(super) async fn replay(
        &self,
        held_hash: &str,
        digest: &str,
        sandbox_id: &str,
    ) -> Result<Answer, Error> {
        if held_hash != digest {
            return Err(Error::new(
                Kind::Conflict,
                "idempotency_conflict",
                "this Idempotency-Key was used with a different request body",
            )
            .with_details(Details {
                sandbox_id: Some(sandbox_id.to_string()),
                ..Details::default()
            }));
        }
        // Give the original request's short wait a chance to finish, then answer as it did.
        // Local waits run on the monotonic clock: a wall-clock step must not cut or stretch them.
        let deadline = Instant::now() + Duration::from_millis(self.deps.config.short_wait_ms);
        loop {
            let row = self
                .deps
                .store
                .get_sandbox(sandbox_id)
                .await
                .map_err(internal)?;
            let in_flight = row
                .as_ref()
                .is_some_and(|r| IN_FLIGHT_STATES.contains(&r.state.as_str()));
            if !in_flight || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.respond(sandbox_id, None).await
    }
}
