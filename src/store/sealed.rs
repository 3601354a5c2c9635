//! Every sealed value the store holds, for re-sealing under a new master key (`sandgate
//! store rekey`), and the deployment's own sealed secrets (`store_secrets`).
//!
//! A re-seal is compare-and-swap on the sealed bytes: it replaces exactly the value that
//! was read, so a value rewritten meanwhile (a credential rotated through the API) is left
//! to the writer, who sealed it under the current key already.

use super::{Store, StoreError, StoreRow};

/// The name of the placeholder seed in `store_secrets`.
pub const PLACEHOLDER_SEED: &str = "placeholder_seed";

impl Store {
    /// A deployment secret, sealed.
    pub async fn store_secret(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        const SQL: &str = "SELECT sealed FROM store_secrets WHERE name = $1";
        Ok(with_pool!(self, pool => match sqlx::query(SQL)
            .bind(name)
            .fetch_optional(pool)
            .await?
        {
            Some(r) => Some(r.col::<Vec<u8>>("sealed")?),
            None => None,
        }))
    }

    /// Stores a deployment secret unless one of that name exists (replicas starting
    /// together agree on the first); returns whether this one was stored.
    pub async fn insert_store_secret(&self, name: &str, sealed: &[u8]) -> Result<bool, StoreError> {
        const SQL: &str = "INSERT INTO store_secrets (name, sealed) VALUES ($1, $2)
             ON CONFLICT (name) DO NOTHING";
        let inserted = with_pool!(self, pool => sqlx::query(SQL)
            .bind(name)
            .bind(sealed)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(inserted > 0)
    }

    /// Stores a deployment secret, replacing one of that name.
    pub async fn put_store_secret(&self, name: &str, sealed: &[u8]) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO store_secrets (name, sealed) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(name)
            .bind(sealed)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// Removes a deployment secret (absent is fine).
    pub async fn delete_store_secret(&self, name: &str) -> Result<(), StoreError> {
        const SQL: &str = "DELETE FROM store_secrets WHERE name = $1";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(name)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// Every sandbox's sealed egress token: `(id, sealed)`.
    pub async fn sealed_tokens(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        const SQL: &str = "SELECT id, token_sealed FROM sandboxes ORDER BY id";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| Ok::<_, sqlx::Error>((r.col("id")?, r.col("token_sealed")?)))
            .collect::<Result<_, _>>()?))
    }

    /// Every deployment secret: `(name, sealed)`.
    pub async fn sealed_store_secrets(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        const SQL: &str = "SELECT name, sealed FROM store_secrets ORDER BY name";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| Ok::<_, sqlx::Error>((r.col("name")?, r.col("sealed")?)))
            .collect::<Result<_, _>>()?))
    }

    /// Replaces a credential's sealed secret if it is still `old`; whether it did.
    pub async fn reseal_credential(
        &self,
        workspace: &str,
        name: &str,
        old: &[u8],
        new: &[u8],
    ) -> Result<bool, StoreError> {
        const SQL: &str = "UPDATE credentials SET sealed = $4
             WHERE workspace = $1 AND name = $2 AND sealed = $3";
        let n = with_pool!(self, pool => sqlx::query(SQL)
            .bind(workspace)
            .bind(name)
            .bind(old)
            .bind(new)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(n > 0)
    }

    /// Replaces a sandbox's sealed token if it is still `old`; whether it did.
    pub async fn reseal_token(&self, id: &str, old: &[u8], new: &[u8]) -> Result<bool, StoreError> {
        const SQL: &str =
            "UPDATE sandboxes SET token_sealed = $3 WHERE id = $1 AND token_sealed = $2";
        let n = with_pool!(self, pool => sqlx::query(SQL)
            .bind(id)
            .bind(old)
            .bind(new)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(n > 0)
    }

    /// Replaces a deployment secret's sealed value if it is still `old`; whether it did.
    pub async fn reseal_store_secret(
        &self,
        name: &str,
        old: &[u8],
        new: &[u8],
    ) -> Result<bool, StoreError> {
        const SQL: &str = "UPDATE store_secrets SET sealed = $3 WHERE name = $1 AND sealed = $2";
        let n = with_pool!(self, pool => sqlx::query(SQL)
            .bind(name)
            .bind(old)
            .bind(new)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(n > 0)
    }
}
