//! Following other replicas' sandbox changes (see `crate::propagation`): the egress
//! identities this replica serves track the store, whichever replica created or deleted the
//! sandbox.
//!
//! A registration made here comes from a store read, which may be older than a delete that
//! revoked the identity meanwhile (on this replica or, through the feed, on another): the
//! registry's revocation mark, taken before the read, keeps such a stale read from bringing
//! a deleted sandbox's token back.

use super::Coordinator;
use crate::store::StoreError;

/// The states whose sandbox has an egress identity (as `Store::running_sandboxes`).
fn has_identity(state: &str) -> bool {
    matches!(state, "running" | "paused" | "stopped")
}

impl Coordinator {
    /// Brings one sandbox's identity in line with its stored state: registered when the
    /// sandbox is live and this replica does not serve it yet, revoked (its tunnels cut)
    /// when it is gone or no longer live. Returns whether anything changed. An identity
    /// already served is kept as it is, so its open tunnels are not disturbed.
    pub async fn follow(&self, id: &str) -> Result<bool, StoreError> {
        let identities = &self.deps.identities;
        let mark = identities.mark();
        let row = self.deps.store.get_sandbox(id).await?;
        match row.filter(|r| has_identity(&r.state)) {
            Some(row) => Ok(self
                .sandbox_identity(&row)
                .is_some_and(|identity| identities.register_unless_revoked_since(identity, mark))),
            None => Ok(identities.revoke(id)),
        }
    }

    /// An id the proxy does not serve, read from the store before it is refused (see
    /// `crate::identity::lookup`): a live sandbox's identity is registered, its bound
    /// credentials read first when this replica has not heard of them yet (an identity
    /// registered without them would be kept that way). Unlike [`Coordinator::follow`], an
    /// absent or ended sandbox revokes nothing: this is a read on behalf of an unknown caller.
    /// Returns whether this replica serves the identity now.
    pub async fn look_up_identity(&self, id: &str) -> Result<bool, StoreError> {
        let identities = &self.deps.identities;
        let Some(row) = self.deps.store.get_sandbox(id).await? else {
            return Ok(false);
        };
        if !has_identity(&row.state) {
            return Ok(false);
        }
        if let Ok(body) = serde_json::from_str::<super::CreateBody>(&row.request_json) {
            for name in &body.credentials {
                if self.deps.credentials.get(&row.workspace, name).is_none() {
                    if let Err(e) = self.deps.credentials.refresh(&row.workspace, name).await {
                        tracing::warn!(sandbox = %id, credential = %name, error = %e, "could not read a bound credential");
                    }
                }
            }
        }
        if let Some(identity) = self.sandbox_identity(&row) {
            // Mark 0: any revocation this replica remembers refuses the registration, not
            // only one since the read. A delete revokes before its store write commits, so a
            // lookup that starts in between reads the row still running; and since this
            // replica skips its own change rows, nothing would revoke it again here.
            // Revocations are final (delete, instance lost), so none is wrongly refused.
            identities.register_unless_revoked_since(identity, 0);
        }
        Ok(identities.get(id).is_some())
    }

    /// Every sandbox identity against the store (the safety net for changes this replica
    /// did not hear of): live sandboxes it does not serve are registered, identities of
    /// sandboxes no longer live are revoked. Returns how many it repaired.
    pub async fn reconcile_identities(&self) -> Result<usize, StoreError> {
        let identities = &self.deps.identities;
        let mark = identities.mark();
        let live = self.deps.store.running_sandboxes().await?;
        let mut repaired = 0;
        for row in &live {
            if identities.get(&row.id).is_none() {
                if let Some(identity) = self.sandbox_identity(row) {
                    repaired +=
                        usize::from(identities.register_unless_revoked_since(identity, mark));
                }
            }
        }
        let live_ids: std::collections::HashSet<&str> =
            live.iter().map(|r| r.id.as_str()).collect();
        for id in identities.sandbox_ids() {
            // Served but not live in the read: read it again before cutting it, since it
            // may have been placed after the read above.
            if !live_ids.contains(id.as_str()) && self.follow(&id).await? {
                repaired += 1;
            }
        }
        Ok(repaired)
    }
}
