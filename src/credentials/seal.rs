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
    #[error("{ACCEPTED_KEYS_ENV} must hold keys of 64 hex characters or base64 of 32 bytes")]
    BadAcceptedEnvKey,
    #[error("a sealed secret could not be opened (wrong master key or corrupted data)")]
    Open,
    #[error("sealing failed")]
    Seal,
}

/// The sealing keys: the current one, which seals, and any number of accepted ones, which
/// only open (a key rotation in progress). Placeholders are derived from a seed of their
/// own (see [`MasterKey::placeholder_seed`]), so they survive a rotation.
pub struct MasterKey {
    /// Current key first.
    keys: Vec<LessSafeKey>,
    placeholder_key: hmac::Key,
    /// The seed placeholders derive from by default (the current key's, as before seeds
    /// were stored): what a store without a seed adopts.
    default_seed: Zeroizing<Vec<u8>>,
}

/// Where an opened value was sealed: under the current key, or an accepted older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealedUnder {
    Current,
    Accepted,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey([redacted])")
    }
}

/// Keys accepted for opening (not sealing) during a rotation, besides `[secrets]
/// accepted_key_files`: hex or base64 keys separated by commas or whitespace.
pub const ACCEPTED_KEYS_ENV: &str = "SANDGATE_ACCEPTED_MASTER_KEYS";

impl MasterKey {
    /// `SANDGATE_MASTER_KEY` if set, else the key file (generated when absent).
    pub fn load(key_file: &Path) -> Result<MasterKey, SealError> {
        MasterKey::load_ring(key_file, &[])
    }

    /// The current key as [`MasterKey::load`] finds it, plus the accepted ones: each of
    /// `accepted_files` and each key in `SANDGATE_ACCEPTED_MASTER_KEYS`.
    pub fn load_ring(
        key_file: &Path,
        accepted_files: &[std::path::PathBuf],
    ) -> Result<MasterKey, SealError> {
        let current = match std::env::var(MASTER_KEY_ENV) {
            Ok(text) => decode_key(text.trim()).ok_or(SealError::BadEnvKey)?,
            Err(_) => read_or_generate(key_file)?,
        };
        let mut accepted = Vec::new();
        for file in accepted_files {
            accepted.push(read_key_file(file)?);
        }
        if let Ok(text) = std::env::var(ACCEPTED_KEYS_ENV) {
            for part in text
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty())
            {
                accepted.push(decode_key(part).ok_or(SealError::BadAcceptedEnvKey)?);
            }
        }
        let refs: Vec<&[u8]> = accepted.iter().map(|k| k.as_slice()).collect();
        MasterKey::ring(&current, &refs)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<MasterKey, SealError> {
        MasterKey::ring(bytes, &[])
    }

    /// `current` seals and opens; each of `accepted` only opens.
    pub fn ring(current: &[u8], accepted: &[&[u8]]) -> Result<MasterKey, SealError> {
        let mut keys = vec![aead_key(current)?];
        for key in accepted {
            keys.push(aead_key(key)?);
        }
        let default_seed = derive(current, b"sandgate placeholder v1")?;
        Ok(MasterKey {
            keys,
            placeholder_key: hmac::Key::new(hmac::HMAC_SHA256, &default_seed),
            default_seed,
        })
    }

    /// The seed placeholders are derived from when the store holds none yet: the current
    /// key's own derivation, which keeps the placeholders of sandboxes created before seeds
    /// were stored.
    pub fn default_placeholder_seed(&self) -> Secret {
        Secret::new(hex(&self.default_seed))
    }

    /// Derives placeholders from `seed` (the deployment's stored seed, hex) from now on.
    pub fn use_placeholder_seed(&mut self, seed: &Secret) -> Result<(), SealError> {
        let bytes = decode_key(seed.expose().trim()).ok_or(SealError::Open)?;
        self.placeholder_key = hmac::Key::new(hmac::HMAC_SHA256, &bytes);
        Ok(())
    }

    /// How many keys open (the current one and the accepted ones).
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Seals under the current key.
    pub fn seal(&self, secret: &Secret, context: &str) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError::Seal)?;
        let mut buffer = secret.expose().as_bytes().to_vec();
        self.keys[0]
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

    /// Opens a value sealed under any key of the ring.
    pub fn open(&self, sealed: &[u8], context: &str) -> Result<Secret, SealError> {
        self.open_with(sealed, context).map(|(secret, _)| secret)
    }

    /// [`MasterKey::open`], saying which key it took (`store rekey` re-seals the others).
    /// The current key is tried first; a wrong key fails AES-GCM's tag check.
    pub fn open_with(
        &self,
        sealed: &[u8],
        context: &str,
    ) -> Result<(Secret, SealedUnder), SealError> {
        if sealed.len() < 1 + NONCE_LEN + 16 || sealed[0] != VERSION {
            return Err(SealError::Open);
        }
        for (i, key) in self.keys.iter().enumerate() {
            let nonce = Nonce::try_assume_unique_for_key(&sealed[1..1 + NONCE_LEN])
                .map_err(|_| SealError::Open)?;
            let mut buffer = Zeroizing::new(sealed[1 + NONCE_LEN..].to_vec());
            let Ok(plain) = key.open_in_place(nonce, Aad::from(context.as_bytes()), &mut buffer)
            else {
                continue;
            };
            let text = std::str::from_utf8(plain).map_err(|_| SealError::Open)?;
            let under = if i == 0 {
                SealedUnder::Current
            } else {
                SealedUnder::Accepted
            };
            return Ok((Secret::new(text), under));
        }
        Err(SealError::Open)
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

impl MasterKey {
    /// A sandbox's envd access token for the E2B facade (`X-Access-Token`): derived, so
    /// every replica sharing the key computes the same one and nothing needs storing;
    /// unguessable without the master key; one per sandbox. (Its message has one line
    /// break where a placeholder's has two, so the two never coincide.)
    pub fn envd_token(&self, sandbox_id: &str) -> String {
        let message = format!("e2b-envd-access-token\n{sandbox_id}");
        let tag = hmac::sign(&self.placeholder_key, message.as_bytes());
        hex(&tag.as_ref()[..24])
    }

    /// The token that opens `port` of a sandbox through the ports gateway (`None`: every
    /// port of it, the E2B facade's `trafficAccessToken`). Derived like
    /// [`MasterKey::envd_token`], so nothing is stored and every replica agrees; its
    /// message starts with its own label, so it never equals another derived value.
    pub fn port_token(&self, sandbox_id: &str, port: Option<u16>) -> String {
        let scope = port.map_or_else(|| "*".to_string(), |p| p.to_string());
        let message = format!("sandgate-port-token\n{sandbox_id}\n{scope}");
        let tag = hmac::sign(&self.placeholder_key, message.as_bytes());
        format!("sgp_{}", hex(&tag.as_ref()[..24]))
    }

    /// Whether `presented` opens `port` of the sandbox: its own port's token or the
    /// sandbox-wide one, compared in constant time.
    pub fn port_token_matches(&self, sandbox_id: &str, port: u16, presented: &str) -> bool {
        let presented = presented.as_bytes();
        [Some(port), None].into_iter().any(|scope| {
            let expected = self.port_token(sandbox_id, scope);
            bool::from(subtle::ConstantTimeEq::ct_eq(
                expected.as_bytes(),
                presented,
            ))
        })
    }
}

/// Every placeholder starts with the prefix and is the prefix plus 40 hex characters
/// long; the proxy looks for it in headers and query strings. Defined beside the scanner
/// that finds them, which the decision log shares without depending on credentials.
pub use crate::base::scan::{PLACEHOLDER_LEN, PLACEHOLDER_PREFIX};

/// A key for one use, derived from a master key (HMAC-SHA256 over the use's label).
fn derive(master: &[u8], label: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
    if master.len() != 32 {
        return Err(SealError::BadEnvKey);
    }
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, master), label);
    Ok(Zeroizing::new(tag.as_ref().to_vec()))
}

fn aead_key(master: &[u8]) -> Result<LessSafeKey, SealError> {
    let key = derive(master, b"sandgate seal v1")?;
    Ok(LessSafeKey::new(
        UnboundKey::new(&AES_256_GCM, &key).map_err(|_| SealError::Seal)?,
    ))
}

fn key_file_error(path: &Path, reason: String) -> SealError {
    SealError::KeyFile {
        path: path.display().to_string(),
        reason,
    }
}

/// The key in `path`, generated (mode 0600) when the file does not exist.
fn read_or_generate(path: &Path) -> Result<Zeroizing<Vec<u8>>, SealError> {
    if !path.exists() {
        let mut bytes = Zeroizing::new([0u8; 32]);
        SystemRandom::new()
            .fill(bytes.as_mut())
            .map_err(|_| key_file_error(path, "no random source".into()))?;
        write_private(path, hex(bytes.as_ref()).as_bytes())
            .map_err(|e| key_file_error(path, e.to_string()))?;
        tracing::info!(path = %path.display(), "generated a new master key for sealing secrets");
    }
    read_key_file(path)
}

/// The key in an existing file (an accepted key is never generated).
fn read_key_file(path: &Path) -> Result<Zeroizing<Vec<u8>>, SealError> {
    let text = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|e| key_file_error(path, e.to_string()))?,
    );
    decode_key(text.trim())
        .ok_or_else(|| key_file_error(path, "not 32 bytes of hex or base64".into()))
}

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
    fn a_port_token_opens_its_own_port_of_its_own_sandbox_only() {
        let key = MasterKey::from_bytes(&[7u8; 32]).unwrap();
        let token = key.port_token("sb-1", Some(8000));
        assert!(token.starts_with("sgp_") && token.len() == 52, "{token}");
        assert!(key.port_token_matches("sb-1", 8000, &token));
        assert!(!key.port_token_matches("sb-1", 8001, &token));
        assert!(!key.port_token_matches("sb-2", 8000, &token));
        assert!(!key.port_token_matches("sb-1", 8000, &token[..51]));
        assert!(!key.port_token_matches("sb-1", 8000, ""));
        let every = key.port_token("sb-1", None);
        assert!(key.port_token_matches("sb-1", 1, &every));
        assert!(!key.port_token_matches("sb-2", 1, &every));
        let other = MasterKey::from_bytes(&[8u8; 32]).unwrap();
        assert!(!other.port_token_matches("sb-1", 8000, &token));
        assert_ne!(token, key.envd_token("sb-1"));
    }

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
    fn a_ring_seals_under_the_current_key_and_opens_under_any() {
        let (old, new) = ([1u8; 32], [2u8; 32]);
        let before = MasterKey::from_bytes(&old).unwrap();
        let sealed_old = before.seal(&Secret::new("s"), "c").unwrap();
        // Rotation: the new key seals, the old one is accepted.
        let during = MasterKey::ring(&new, &[&old]).unwrap();
        assert_eq!(during.key_count(), 2);
        let (secret, under) = during.open_with(&sealed_old, "c").unwrap();
        assert_eq!((secret.expose(), under), ("s", SealedUnder::Accepted));
        let sealed_new = during.seal(&Secret::new("t"), "c").unwrap();
        assert_eq!(
            during.open_with(&sealed_new, "c").unwrap().1,
            SealedUnder::Current
        );
        // The old key alone cannot open what the new one sealed; the new alone cannot open
        // what was not re-sealed.
        assert!(before.open(&sealed_new, "c").is_err());
        let after = MasterKey::from_bytes(&new).unwrap();
        assert!(after.open(&sealed_old, "c").is_err());
        assert!(during.open(&sealed_old, "other context").is_err());
    }

    #[test]
    fn placeholders_follow_the_seed_not_the_key() {
        let old = MasterKey::from_bytes(&[1u8; 32]).unwrap();
        let seed = old.default_placeholder_seed();
        let before = old.placeholder("sb1", "ws", "gh");
        let mut rotated = MasterKey::ring(&[2u8; 32], &[&[1u8; 32]]).unwrap();
        assert_ne!(rotated.placeholder("sb1", "ws", "gh"), before);
        rotated.use_placeholder_seed(&seed).unwrap();
        assert_eq!(rotated.placeholder("sb1", "ws", "gh"), before);
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
