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
