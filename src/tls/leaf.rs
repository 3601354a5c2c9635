//! Leaf certificates for intercepted hosts: one fresh key per leaf (never the CA key), SAN for
//! the host, AKI pointing at the CA, a short validity, served with the full chain. Minted
//! leaves are cached (bounded) and re-minted once half their validity has passed, so a
//! repeated host costs no signing and a served leaf never nears expiry.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::ca::{rand_bytes, CertAuthority};

#[derive(Debug, thiserror::Error)]
pub enum LeafError {
    #[error("cannot mint a certificate for {host:?}: {reason}")]
    Mint { host: String, reason: String },
}

#[derive(Clone)]
struct CachedLeaf {
    key: Arc<CertifiedKey>,
    renew_at: Instant,
}

pub struct LeafMinter {
    ca: Arc<CertAuthority>,
    validity: Duration,
    cache: quick_cache::sync::Cache<String, CachedLeaf>,
}

impl std::fmt::Debug for LeafMinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafMinter")
            .field("validity", &self.validity)
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl LeafMinter {
    pub fn new(ca: Arc<CertAuthority>, validity: Duration, capacity: usize) -> Self {
        LeafMinter {
            ca,
            validity,
            cache: quick_cache::sync::Cache::new(capacity.max(1)),
        }
    }

    pub fn ca(&self) -> &CertAuthority {
        &self.ca
    }

    /// The leaf for `host` (a DNS name or an IP literal), from the cache when still fresh.
    pub fn leaf_for(&self, host: &str) -> Result<Arc<CertifiedKey>, LeafError> {
        let now = Instant::now();
        if let Some(hit) = self.cache.get(host) {
            if hit.renew_at > now {
                metrics::counter!("sandgate_tls_leaf_cache_hits_total").increment(1);
                return Ok(hit.key);
            }
        }
        let key = Arc::new(self.mint(host)?);
        metrics::counter!("sandgate_tls_leaf_minted_total").increment(1);
        self.cache.insert(
            host.to_string(),
            CachedLeaf {
                key: key.clone(),
                renew_at: now + self.validity / 2,
            },
        );
        Ok(key)
    }

    /// Whether a fresh leaf for `host` is cached, so [`LeafMinter::leaf_for`] would not sign
    /// (the egress proxy's budget for refused names counts only leaves it would mint).
    pub fn is_cached(&self, host: &str) -> bool {
        self.cache
            .get(host)
            .is_some_and(|hit| hit.renew_at > Instant::now())
    }

    /// A fresh leaf for `host`, signed by the CA with the configured validity, bypassing the
    /// cache: for a certificate its caller keeps and renews itself (the TLS proxy listener's).
    pub fn issue(&self, host: &str) -> Result<Arc<CertifiedKey>, LeafError> {
        self.mint(host).map(Arc::new)
    }

    /// How long a leaf is valid.
    pub fn validity(&self) -> Duration {
        self.validity
    }

    fn mint(&self, host: &str) -> Result<CertifiedKey, LeafError> {
        let err = |reason: String| LeafError::Mint {
            host: host.to_string(),
            reason,
        };
        let key = KeyPair::generate().map_err(|e| err(e.to_string()))?;
        let mut params = CertificateParams::default();
        let san = match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.try_into()
                    .map_err(|e: rcgen::Error| err(e.to_string()))?,
            ),
        };
        params.subject_alt_names = vec![san];
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host);
        name.push(DnType::OrganizationName, "sandgate");
        params.distinguished_name = name;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let mut serial = [0u8; 16];
        rand_bytes(&mut serial);
        serial[0] &= 0x7f;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let now = time::OffsetDateTime::now_utc();
        // Backdated an hour to tolerate clock skew inside sandboxes.
        params.not_before = now - time::Duration::hours(1);
        params.not_after =
            now + time::Duration::try_from(self.validity).unwrap_or(time::Duration::DAY);
        let cert = params
            .signed_by(&key, self.ca.issuer())
            .map_err(|e| err(e.to_string()))?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing_key = any_supported_type(&key_der).map_err(|e| err(e.to_string()))?;
        Ok(CertifiedKey::new(
            vec![cert.der().clone(), self.ca.cert_der().clone()],
            signing_key,
        ))
    }
}

/// Picks the leaf by SNI. Connections without SNI are handled by the caller with a
/// connection-specific config (the CONNECT authority names the certificate then).
#[derive(Debug)]
pub struct SniResolver(pub Arc<LeafMinter>);

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        match self.0.leaf_for(&crate::domain::normalize_host(name)) {
            Ok(key) => Some(key),
            Err(e) => {
                tracing::warn!(error = %e, "leaf certificate minting failed");
                None
            }
        }
    }
}

/// Serves one fixed leaf (used for IP-literal destinations, which carry no SNI).
#[derive(Debug)]
pub struct FixedResolver(pub Arc<CertifiedKey>);

impl ResolvesServerCert for FixedResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}
