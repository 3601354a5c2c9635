//! The deployment's key material beyond the master key: the placeholder seed.
//!
//! Placeholders (what a sandbox sees instead of a credential) must stay the same for the
//! life of a sandbox, including across a master key rotation: they are derived from a seed
//! stored sealed in the store (`store_secrets`), not from the master key itself. A store
//! without a seed adopts the one the current key used to derive, so placeholders handed
//! out before seeds were stored keep working.

use super::seal::MasterKey;
use super::CredentialError;
use crate::store::sealed::PLACEHOLDER_SEED;
use crate::store::Store;

/// The associated data a deployment secret is sealed with.
pub fn store_secret_context(name: &str) -> String {
    format!("store-secret\n{name}")
}

/// Makes `key` derive placeholders from the store's seed, storing the default one first
/// when there is none (the first replica to store it wins; the others read it).
pub async fn adopt_placeholder_seed(
    store: &Store,
    key: &mut MasterKey,
) -> Result<(), CredentialError> {
    let context = store_secret_context(PLACEHOLDER_SEED);
    let sealed = match store.store_secret(PLACEHOLDER_SEED).await? {
        Some(sealed) => sealed,
        None => {
            let sealed = key.seal(&key.default_placeholder_seed(), &context)?;
            store.insert_store_secret(PLACEHOLDER_SEED, &sealed).await?;
            store
                .store_secret(PLACEHOLDER_SEED)
                .await?
                .unwrap_or(sealed)
        }
    };
    let seed = key.open(&sealed, &context)?;
    key.use_placeholder_seed(&seed)?;
    Ok(())
}
