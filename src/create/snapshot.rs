//! Creating from saved state (`snapshot`): which pools can restore a provider snapshot (where
//! it was taken) or a filesystem export (wherever files are written), and the export written
//! into the new instance once it runs.

use super::{internal, record, Coordinator, Job, StoredCandidate};
use crate::error::{Attempts, Details, Error, Kind};
use crate::store::snapshots::SnapshotRow;

impl Coordinator {
    /// Whether `snapshot` can seed a sandbox on `pool`: a provider snapshot only where it
    /// was taken (its provider and account), a filesystem export wherever files are written.
    pub(super) fn restorable_on(&self, snapshot: &SnapshotRow, pool: &str) -> bool {
        if snapshot.kind == crate::store::snapshots::FILESYSTEM_EXPORT {
            let topo = &self.deps.topology;
            return topo
                .pool(pool)
                .is_some_and(|p| p.capabilities.filesystem.write);
        }
        snapshot.pool == pool
    }

    /// The refusal of a create whose snapshot no candidate pool can restore, with an
    /// `unmet_requirements` entry per pool the route ranked.
    pub(super) fn unrestorable(
        &self,
        snapshot: &SnapshotRow,
        route: &sandgate_router::Route,
    ) -> Error {
        let why = record::unrestorable_reason(snapshot);
        let attempts = route
            .candidates
            .iter()
            .map(|c| sandgate_router::Attempt {
                provider: c.provider.to_string(),
                pool: c.pool.to_string(),
                unmet_requirements: vec![why.to_string()],
            })
            .collect();
        Error::new(
            Kind::Unprocessable,
            "no_eligible_pool",
            format!(
                "no pool this request may use can restore snapshot {}",
                snapshot.id
            ),
        )
        .with_details(Details {
            field: Some("snapshot".into()),
            pool: Some(snapshot.pool.clone()),
            kind: Some(snapshot.kind.clone()),
            attempts: Some(Attempts::Ruled(attempts)),
            ..Details::default()
        })
    }

    /// A snapshot of this workspace (the same answer for "absent" and "another
    /// workspace's", so ids of other workspaces stay private).
    pub(super) async fn snapshot_row(
        &self,
        snapshot: &str,
        workspace: &str,
    ) -> Result<SnapshotRow, Error> {
        match self
            .deps
            .store
            .get_snapshot(snapshot)
            .await
            .map_err(internal)?
        {
            Some(row) if row.workspace == workspace => Ok(row),
            _ => Err(Error::new(
                Kind::Invalid,
                "invalid_request",
                format!("`snapshot`: no snapshot {snapshot:?} in workspace {workspace:?}"),
            )
            .field("snapshot")),
        }
    }

    /// The snapshot the create names, if any (read again: the create may run after a restart).
    pub(super) async fn snapshot_of(&self, job: &Job) -> Option<SnapshotRow> {
        let id = job.body.snapshot.as_deref()?;
        self.deps.store.get_snapshot(id).await.ok().flatten()
    }

    /// Writes a filesystem export the create names into the new instance (its files, never
    /// memory state); nothing to do for a provider snapshot or none.
    pub(super) async fn restore_export(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        instance_id: &str,
    ) -> Result<(), String> {
        let Some(snapshot) = self.snapshot_of(job).await else {
            return Ok(());
        };
        if snapshot.kind != crate::store::snapshots::FILESYSTEM_EXPORT {
            return Ok(());
        }
        let archive = match self.deps.store.snapshot_archive(&snapshot.id).await {
            Ok(Some(archive)) => archive,
            Ok(None) => return Err(format!("the export {} has no archive", snapshot.id)),
            Err(e) => return Err(format!("reading the export {}: {e}", snapshot.id)),
        };
        let adapter = self
            .deps
            .providers
            .for_pool(&cand.pool)
            .ok_or("no adapter for the pool")?;
        let summary = crate::providers::export::restore(adapter.as_ref(), instance_id, &archive)
            .await
            .map_err(|e| format!("restoring the export {}: {e}", snapshot.id))?;
        tracing::info!(sandbox = %job.row.id, export = %snapshot.id, files = summary.files, bytes = summary.bytes, "filesystem export restored");
        Ok(())
    }
}
