//! Sealing secrets at rest with AES-256-GCM (ring, the crypto provider sandgate already
//! uses) under a master key, and deriving placeholders.
//!
//! The master key comes from `SANDGATE_MASTER_KEY` (64 hex characters or base64 of 32 bytes)
//! or from a key file generated on first start with mode 0600. A sealed value is
//! `0x01 || nonce(12) || ciphertext || tag(16)`; the associated data binds it to its
//! workspace and credential name, so a sealed secret copied onto another row does not open.

use std::path::Path;

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use super::Secret;

pub const MASTER_KEY_ENV: &str = "SANDGATE_MASTER_KEY";
const VERSION: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("{MASTER_KEY_ENV} must be 64 hex characters or base64 of 32 bytes")]
    BadEnvKey,
    #[error("master key file {path}: {reason}")]
    KeyFile { path: String, reason: String },
    #[error("a sealed secret could not be opened (wrong master key or corrupted data)")]
    Open,
    #[error("sealing failed")]
    Seal,
}

pub struct MasterKey {
    aead: LessSafeKey,
    placeholder_key: hmac::Key,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey([redacted])")
    }
}

impl MasterKey {
    /// `SANDGATE_MASTER_KEY` if set, else the key file (generated when absent).
    pub fn load(key_file: &Path) -> Result<MasterKey, SealError> {
        if let Ok(text) = std::env::var(MASTER_KEY_ENV) {
            return MasterKey::from_bytes(&decode_key(text.trim()).ok_or(SealError::BadEnvKey)?);
        }
        let err = |reason: String| SealError::KeyFile {
            path: key_file.display().to_string(),
            reason,
        };
        if !key_file.exists() {
            let mut bytes = Zeroizing::new([0u8; 32]);
            SystemRandom::new()
                .fill(bytes.as_mut())
                .map_err(|_| err("no random source".into()))?;
            write_private(key_file, hex(bytes.as_ref()).as_bytes())
                .map_err(|e| err(e.to_string()))?;
            tracing::info!(path = %key_file.display(), "generated a new master key for sealing secrets");
        }
        let text =
            Zeroizing::new(std::fs::read_to_string(key_file).map_err(|e| err(e.to_string()))?);
        let bytes =
            decode_key(text.trim()).ok_or_else(|| err("not 32 bytes of hex or base64".into()))?;
        MasterKey::from_bytes(&bytes)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<MasterKey, SealError> {
        if bytes.len() != 32 {
            return Err(SealError::BadEnvKey);
        }
        // Separate keys for the two uses, derived from the master key.
        let derive = |label: &[u8]| {
            let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, bytes), label);
            Zeroizing::new(tag.as_ref().to_vec())
        };
        let aead_key = derive(b"sandgate seal v1");
        let placeholder_key = derive(b"sandgate placeholder v1");
        Ok(MasterKey {
            aead: LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, &aead_key).map_err(|_| SealError::Seal)?,
            ),
            placeholder_key: hmac::Key::new(hmac::HMAC_SHA256, &placeholder_key),
        })
    }

    pub fn seal(&self, secret: &Secret, context: &str) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError::Seal)?;
        let mut buffer = secret.expose().as_bytes().to_vec();
        self.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut buffer,
            )
            .map_err(|_| SealError::Seal)?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + buffer.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buffer);
        Ok(out)
    }

    pub fn open(&self, sealed: &[u8], context: &str) -> Result<Secret, SealError> {
        if sealed.len() < 1 + NONCE_LEN + 16 || sealed[0] != VERSION {
            return Err(SealError::Open);
        }
        let nonce = Nonce::try_assume_unique_for_key(&sealed[1..1 + NONCE_LEN])
            .map_err(|_| SealError::Open)?;
        let mut buffer = Zeroizing::new(sealed[1 + NONCE_LEN..].to_vec());
        let plain = self
            .aead
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut buffer)
            .map_err(|_| SealError::Open)?;
        let text = std::str::from_utf8(plain).map_err(|_| SealError::Open)?;
        Ok(Secret::new(text))
    }

    /// The placeholder a sandbox sees instead of a credential: stable for one sandbox and
    /// credential (it survives restarts), unguessable without the master key, and different
    /// for every sandbox, so one sandbox's placeholder means nothing in another's traffic.
    pub fn placeholder(&self, sandbox_id: &str, workspace: &str, credential: &str) -> String {
        let message = format!("{workspace}\n{sandbox_id}\n{credential}");
        let tag = hmac::sign(&self.placeholder_key, message.as_bytes());
        format!("{PLACEHOLDER_PREFIX}{}", hex(&tag.as_ref()[..20]))
    }
}

/// Every placeholder starts with this; the proxy looks for it in headers and query strings.
pub const PLACEHOLDER_PREFIX: &str = "sgph_";
/// Length of a whole placeholder: the prefix plus 40 hex characters.
pub const PLACEHOLDER_LEN: usize = PLACEHOLDER_PREFIX.len() + 40;

fn decode_key(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    if text.len() == 64 && text.chars().all(|c| c.is_ascii_hexdigit()) {
        let bytes = (0..32)
            .map(|i| u8::from_str_radix(&text[i * 2..i * 2 + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        return Some(Zeroizing::new(bytes));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    (bytes.len() == 32).then(|| Zeroizing::new(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_round_trips_and_binds_context() {
        let key = MasterKey::from_bytes(&[7u8; 32]).unwrap();
        let sealed = key.seal(&Secret::new("ghp_secret"), "ws/github").unwrap();
        assert!(!sealed.windows(10).any(|w| w == b"ghp_secret"));
        assert_eq!(
            key.open(&sealed, "ws/github").unwrap().expose(),
            "ghp_secret"
        );
        assert!(key.open(&sealed, "other/github").is_err());
        let other = MasterKey::from_bytes(&[8u8; 32]).unwrap();
        assert!(other.open(&sealed, "ws/github").is_err());
    }

    #[test]
    fn placeholders_differ_per_sandbox_and_are_stable() {
        let key = MasterKey::from_bytes(&[7u8; 32]).unwrap();
        let a = key.placeholder("sb1", "ws", "github");
        assert_eq!(a, key.placeholder("sb1", "ws", "github"));
        assert_ne!(a, key.placeholder("sb2", "ws", "github"));
        assert_eq!(a.len(), PLACEHOLDER_LEN);
        assert!(a.starts_with(PLACEHOLDER_PREFIX));
    }

    #[test]
    fn key_file_is_generated_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/master.key");
        let a = MasterKey::load(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let sealed = a.seal(&Secret::new("x"), "c").unwrap();
        let b = MasterKey::load(&path).unwrap();
        assert_eq!(b.open(&sealed, "c").unwrap().expose(), "x");
    }
}
