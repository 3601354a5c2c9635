//! `sandgate store rekey`: re-seals every secret the store holds under the current master
//! key, while the gateway keeps serving.
//!
//! A rotation, on every replica in turn (each step a rolling restart; no step stops
//! service):
//! 1. add the new key as accepted (`[secrets] accepted_key_files` or
//!    `SANDGATE_ACCEPTED_MASTER_KEYS`): every replica can open what it will seal;
//! 2. make the new key current and the old one accepted: new secrets are sealed under it;
//! 3. run `sandgate store rekey` with that configuration: credentials, sandbox tokens and
//!    the placeholder seed sealed under an accepted key are re-sealed under the current one;
//! 4. drop the old key.
//!
//! Each re-seal replaces exactly the bytes it read (compare-and-swap), so a value rewritten
//! meanwhile is left alone and counted as changed; a value that opens under none of the keys
//! is reported by its row (never its content) and makes the command fail. Placeholders do
//! not change: they derive from the stored seed, whose value a re-seal keeps.

use crate::credentials::keys::store_secret_context;
use crate::credentials::seal::{MasterKey, SealError, SealedUnder};
use crate::credentials::CredentialMeta;
use crate::store::{Store, StoreError};

/// What happened to the values of one kind.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// Sealed under an accepted key, now under the current one.
    pub resealed: usize,
    /// Under the current key already.
    pub current: usize,
    /// Rewritten by someone else between the read and the re-seal (run again).
    pub changed: usize,
}

#[derive(Debug, Default)]
pub struct Report {
    pub credentials: Counts,
    pub tokens: Counts,
    pub store_secrets: Counts,
    /// Rows whose value opens under none of the keys: `credential ws/name`, `sandbox id`...
    pub unreadable: Vec<String>,
}

impl Report {
    /// Whether every value is now sealed under the current key.
    pub fn complete(&self) -> bool {
        self.unreadable.is_empty()
            && self.credentials.changed + self.tokens.changed + self.store_secrets.changed == 0
    }
}

/// One sealed value: opened, and re-sealed under the current key when it was not.
enum Outcome {
    Current,
    Resealed(Vec<u8>),
    Unreadable,
}

fn reseal(key: &MasterKey, sealed: &[u8], context: &str) -> Result<Outcome, SealError> {
    match key.open_with(sealed, context) {
        Ok((_, SealedUnder::Current)) => Ok(Outcome::Current),
        Ok((secret, SealedUnder::Accepted)) => Ok(Outcome::Resealed(key.seal(&secret, context)?)),
        Err(_) => Ok(Outcome::Unreadable),
    }
}

/// Re-seals everything; `progress` receives one line per finished kind.
pub async fn rekey(
    store: &Store,
    key: &MasterKey,
    mut progress: impl FnMut(&str),
) -> Result<Report, RekeyError> {
    let mut report = Report::default();
    for row in store.list_credentials().await? {
        let label = format!("credential {}/{}", row.workspace, row.name);
        let Ok(meta) = serde_json::from_str::<CredentialMeta>(&row.meta_json) else {
            report.unreadable.push(label);
            continue;
        };
        match reseal(key, &row.sealed, &meta.seal_context())? {
            Outcome::Current => report.credentials.current += 1,
            Outcome::Unreadable => report.unreadable.push(label),
            Outcome::Resealed(new) => {
                let swapped = store
                    .reseal_credential(&row.workspace, &row.name, &row.sealed, &new)
                    .await?;
                count(&mut report.credentials, swapped);
            }
        }
    }
    progress(&line("credentials", &report.credentials));
    for (id, sealed) in store.sealed_tokens().await? {
        match reseal(key, &sealed, &crate::create::token_context(&id))? {
            Outcome::Current => report.tokens.current += 1,
            Outcome::Unreadable => report
                .unreadable
                .push(format!("sandbox {id} (egress token)")),
            Outcome::Resealed(new) => {
                let swapped = store.reseal_token(&id, &sealed, &new).await?;
                count(&mut report.tokens, swapped);
            }
        }
    }
    progress(&line("sandbox egress tokens", &report.tokens));
    for (name, sealed) in store.sealed_store_secrets().await? {
        match reseal(key, &sealed, &store_secret_context(&name))? {
            Outcome::Current => report.store_secrets.current += 1,
            Outcome::Unreadable => report.unreadable.push(format!("store secret {name}")),
            Outcome::Resealed(new) => {
                let swapped = store.reseal_store_secret(&name, &sealed, &new).await?;
                count(&mut report.store_secrets, swapped);
            }
        }
    }
    progress(&line(
        "store secrets (placeholder seed)",
        &report.store_secrets,
    ));
    Ok(report)
}

fn count(counts: &mut Counts, swapped: bool) {
    match swapped {
        true => counts.resealed += 1,
        false => counts.changed += 1,
    }
}

fn line(what: &str, c: &Counts) -> String {
    format!(
        "{what}: {} re-sealed, {} already under the current key, {} changed meanwhile",
        c.resealed, c.current, c.changed
    )
}

#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Seal(#[from] SealError),
}
