//! Egress identities: which sandbox a proxy connection speaks for.
//!
//! A sandbox proves who it is with `Proxy-Authorization: Basic base64(id:token)`, which is
//! what every standard client sends for `HTTP_PROXY=http://id:token@host:port`. Static
//! identities come from config; sandboxes created through the API register at runtime and
//! are revoked on deletion. Tokens are compared in constant time, and an unknown id costs
//! the same comparison as a known one so response timing does not reveal which ids exist.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

pub mod lookup;

/// The sandbox context attached to every decision made for a connection.
#[derive(Debug)]
pub struct Identity {
    pub id: String,
    pub workspace: String,
    /// The user in the workspace the sandbox acts for, if any.
    pub user: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub allow_domains: Vec<String>,
    /// The sandbox's `network.cidrs`: addresses it may reach by address (an IP literal, or
    /// what a name resolves to), as policy input (`input.sandbox.cidrs`); see
    /// `egress::by_address`.
    pub cidrs: Vec<ipnet::IpNet>,
    /// Credentials of the workspace (or user) applied to this sandbox's traffic.
    pub bindings: Vec<Binding>,
    token: Vec<u8>,
    /// Cancelled when the identity is revoked or replaced: every tunnel and upgraded stream
    /// opened under it waits on this and ends at once, and every request checks it.
    revoked: CancellationToken,
    /// CONNECT tunnels open under this identity (see [`Identity::open_tunnel`]).
    tunnels: AtomicUsize,
}

/// One open tunnel of an identity, counted until dropped.
#[derive(Debug)]
pub struct TunnelSlot(Arc<Identity>);

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        self.0.tunnels.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One bound credential and the placeholder this sandbox sees for it.
#[derive(Debug, Clone)]
pub struct Binding {
    pub name: String,
    pub placeholder: String,
}

impl Identity {
    pub fn new(
        id: impl Into<String>,
        token: impl Into<Vec<u8>>,
        workspace: impl Into<String>,
        allow_domains: Vec<String>,
        labels: BTreeMap<String, String>,
    ) -> Identity {
        Identity {
            id: id.into(),
            workspace: workspace.into(),
            user: None,
            bindings: Vec::new(),
            labels,
            allow_domains: allow_domains
                .iter()
                .map(|d| crate::domain::normalize_host(d))
                .collect(),
            cidrs: Vec::new(),
            token: token.into(),
            revoked: CancellationToken::new(),
            tunnels: AtomicUsize::new(0),
        }
    }

    /// The same identity, allowed to reach `cidrs` by address (`network.cidrs` as the
    /// create body gave them: CIDRs or bare addresses).
    pub fn with_cidrs(mut self, cidrs: &[String]) -> Identity {
        self.cidrs = parse_cidrs(&self.id, cidrs);
        self
    }

    /// Counts one more open tunnel, unless `max` are open already. The tunnel is counted
    /// until the returned slot is dropped.
    pub fn open_tunnel(self: &Arc<Self>, max: usize) -> Option<TunnelSlot> {
        self.tunnels
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(TunnelSlot(self.clone()))
    }

    /// Tunnels open under this identity now.
    pub fn open_tunnels(&self) -> usize {
        self.tunnels.load(Ordering::Acquire)
    }

    /// Whether the identity was revoked (or replaced). Checked by every request, after its
    /// credentials are applied, so none is forwarded with credentials once `revoke` returned.
    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    /// A handle that is cancelled when the identity is revoked; tunnels select on it.
    pub fn revocation(&self) -> CancellationToken {
        self.revoked.clone()
    }
}

/// `network.cidrs` as stored (CIDRs or bare addresses, validated at creation) as networks:
/// a bare address is a host route (`/32`, `/128`) and host bits are cleared, so policy sees
/// one form (`10.0.0.0/8` for `10.1.2.3/8`). An entry that does not parse (a row from
/// before validation) is left out, with a warning: it allows nothing.
pub fn parse_cidrs(sandbox: &str, cidrs: &[String]) -> Vec<ipnet::IpNet> {
    cidrs
        .iter()
        .filter_map(|text| {
            let parsed = match text.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(ipnet::IpNet::from(ip)),
                Err(_) => text.parse::<ipnet::IpNet>().map(|net| net.trunc()),
            };
            match parsed {
                Ok(net) => Some(net),
                Err(_) => {
                    tracing::warn!(%sandbox, cidr = %text, "network.cidrs entry is not a CIDR; ignored");
                    None
                }
            }
        })
        .collect()
}

/// What binding credentials to an identity needs to know of them. Implemented by
/// `credentials::CredentialStore`; a trait so that identities (which policy and the
/// credential layer both read) do not depend on the credential store.
pub trait CredentialDirectory {
    /// Whether `workspace` has a credential `name`: `None` if not, else the user it belongs
    /// to (`Some(None)`: the whole workspace's).
    fn owner(&self, workspace: &str, name: &str) -> Option<Option<String>>;
    /// The placeholder sandbox `sandbox` of `workspace` sees for credential `name`.
    fn placeholder(&self, sandbox: &str, workspace: &str, name: &str) -> String;
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("identity {id:?}: token_env {var} is not set")]
    MissingTokenEnv { id: String, var: String },
    #[error("config key `{key}`: {message}")]
    Binding { key: String, message: String },
}

impl Identity {
    /// Binds credentials by name. Only the identity's own workspace's credentials exist to
    /// be found, and one that belongs to another user of it is refused.
    pub fn bind(
        mut self,
        user: Option<String>,
        names: &[String],
        credentials: &dyn CredentialDirectory,
        key_path: impl Fn(usize) -> String,
    ) -> Result<Identity, IdentityError> {
        self.user = user;
        for (i, name) in names.iter().enumerate() {
            let Some(owner) = credentials.owner(&self.workspace, name) else {
                return Err(IdentityError::Binding {
                    key: key_path(i),
                    message: format!("no credential {name:?} in workspace {:?}", self.workspace),
                });
            };
            if owner.is_some() && owner != self.user {
                return Err(IdentityError::Binding {
                    key: key_path(i),
                    message: format!(
                        "credential {name:?} belongs to another user of workspace {:?}",
                        self.workspace
                    ),
                });
            }
            let placeholder = credentials.placeholder(&self.id, &self.workspace, name);
            self.bindings.push(Binding {
                name: name.clone(),
                placeholder,
            });
        }
        Ok(self)
    }
}

#[derive(Debug, Default)]
pub struct IdentityRegistry {
    by_id: RwLock<HashMap<String, Arc<Identity>>>,
    /// The ids configured in `[[egress.identities]]`: not sandboxes, so never revoked by
    /// the reconcile of sandbox identities.
    configured: std::collections::HashSet<String>,
    /// Revocations so far, and the number of the latest revocation of each recently revoked
    /// id: a registration made from a store read older than the revocation must not bring
    /// the identity back (see [`IdentityRegistry::register_unless_revoked_since`]).
    revocations: std::sync::atomic::AtomicU64,
    tombstones: std::sync::Mutex<HashMap<String, (u64, std::time::Instant)>>,
    /// Where an id this replica does not serve is looked up before it is refused (set once
    /// the coordinator exists; see [`lookup`]).
    lookup: std::sync::OnceLock<lookup::Lookup>,
}

/// How long a revocation is remembered: far longer than any store read takes.
const TOMBSTONE_FOR: std::time::Duration = std::time::Duration::from_secs(600);

impl IdentityRegistry {
    pub fn from_config(
        identities: &[IdentityConfig],
        credentials: &dyn CredentialDirectory,
    ) -> Result<IdentityRegistry, IdentityError> {
        let registry = IdentityRegistry {
            configured: identities.iter().map(|c| c.id.clone()).collect(),
            ..IdentityRegistry::default()
        };
        for (index, c) in identities.iter().enumerate() {
            let token = match (&c.token, &c.token_env) {
                (Some(t), _) => t.clone(),
                (None, Some(var)) => {
                    std::env::var(var).map_err(|_| IdentityError::MissingTokenEnv {
                        id: c.id.clone(),
                        var: var.clone(),
                    })?
                }
                (None, None) => unreachable!("config validation requires a token"),
            };
            let identity = Identity::new(
                c.id.clone(),
                token.into_bytes(),
                c.workspace.clone(),
                c.allow_domains.clone(),
                c.labels.clone(),
            )
            .bind(c.user.clone(), &c.credentials, credentials, |j| {
                format!("egress.identities[{index}].credentials[{j}]")
            })?;
            registry.register(identity);
        }
        Ok(registry)
    }

    /// Registers an identity. One that replaces an earlier identity of the same id (a new
    /// token, other bindings) revokes the earlier one: its open tunnels end.
    pub fn register(&self, identity: Identity) {
        let mut map = self.by_id.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = map.insert(identity.id.clone(), Arc::new(identity)) {
            old.revoked.cancel();
        }
    }

    /// Revokes an identity: new connections are refused, and every tunnel, upgraded stream
    /// and request already running under it ends (they all wait on its cancellation).
    pub fn revoke(&self, id: &str) -> bool {
        let mut map = self.by_id.write().unwrap_or_else(|e| e.into_inner());
        self.tombstone(id);
        match map.remove(id) {
            Some(old) => {
                old.revoked.cancel();
                true
            }
            None => false,
        }
    }

    /// The current revocation mark: take it before reading the store for a registration.
    pub fn mark(&self) -> u64 {
        self.revocations.load(Ordering::Acquire)
    }

    /// Registers `identity` unless its id was revoked after `mark` was taken (the store
    /// read it comes from may predate a delete), or is served already. Returns whether it
    /// registered.
    pub fn register_unless_revoked_since(&self, identity: Identity, mark: u64) -> bool {
        let mut map = self.by_id.write().unwrap_or_else(|e| e.into_inner());
        let revoked_since = self
            .tombstones
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&identity.id)
            .is_some_and(|(at, _)| *at > mark);
        if revoked_since || map.get(&identity.id).is_some_and(|i| !i.is_revoked()) {
            return false;
        }
        map.insert(identity.id.clone(), Arc::new(identity));
        true
    }

    /// Remembers a revocation (called with the identity map locked, so a registration
    /// checks tombstones and inserts atomically with respect to it).
    fn tombstone(&self, id: &str) {
        let n = self.revocations.fetch_add(1, Ordering::AcqRel) + 1;
        let mut tombstones = self.tombstones.lock().unwrap_or_else(|e| e.into_inner());
        if tombstones.len() >= 4096 {
            tombstones.retain(|_, (_, at)| at.elapsed() < TOMBSTONE_FOR);
        }
        tombstones.insert(id.to_string(), (n, std::time::Instant::now()));
    }

    pub fn get(&self, id: &str) -> Option<Arc<Identity>> {
        self.by_id
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// The registered identities that are sandboxes' (not configured ones).
    pub fn sandbox_ids(&self) -> Vec<String> {
        self.by_id
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .filter(|id| !self.configured.contains(*id))
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_id.read().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets where unknown ids are looked up ([`IdentityRegistry::authenticate_or_look_up`]).
    pub fn set_lookup(&self, lookup: lookup::Lookup) {
        let _ = self.lookup.set(lookup);
    }

    /// Authenticates a `Proxy-Authorization` header value.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Option<Arc<Identity>> {
        let (id, token) = parse_basic(header?)?;
        self.verify(&id, &token)
    }

    /// [`IdentityRegistry::authenticate`], but an id this replica does not serve is looked
    /// up in the store first (a sandbox just created through another replica, whose change
    /// has not arrived yet), within the bounds of [`lookup::Lookup`]. A known id with a wrong
    /// token is refused without a lookup.
    pub async fn authenticate_or_look_up(&self, header: Option<&[u8]>) -> Option<Arc<Identity>> {
        let (id, token) = parse_basic(header?)?;
        // One read of the map decides both questions: checking the token and then, apart,
        // whether the id is known would refuse a sandbox whose identity the change feed
        // registered between the two reads (it was unknown to the first, known to the
        // second, and never looked up).
        let known = match self.check(&id, &token) {
            Check::Valid(identity) => return Some(identity),
            Check::WrongToken => true,
            Check::Unknown => false,
        };
        let lookup = self.lookup.get()?;
        if known {
            return None;
        }
        match lookup.look_up(&id).await {
            lookup::Outcome::Found => self.verify(&id, &token),
            _ => None,
        }
    }

    /// The identity `id` if `token` is its token.
    fn verify(&self, id: &str, token: &[u8]) -> Option<Arc<Identity>> {
        match self.check(id, token) {
            Check::Valid(identity) => Some(identity),
            Check::WrongToken | Check::Unknown => None,
        }
    }

    /// Whether `token` is the token of `id`, from one read of the identity map.
    fn check(&self, id: &str, token: &[u8]) -> Check {
        let found = {
            let map = self.by_id.read().unwrap_or_else(|e| e.into_inner());
            map.get(id).cloned()
        };
        // Compare against a dummy of the same length when the id is unknown, so an
        // attacker cannot tell unknown ids from wrong tokens by timing. (An id this replica
        // does not serve may then be looked up in the store, which takes longer; that tells
        // whether this replica served the id already, never anything about a token.)
        const DUMMY: [u8; 32] = [0u8; 32];
        let expected: &[u8] = found.as_ref().map(|i| i.token.as_slice()).unwrap_or(&DUMMY);
        let equal: bool = expected.ct_eq(token).into();
        match found {
            Some(identity) if equal => Check::Valid(identity),
            Some(_) => Check::WrongToken,
            None => Check::Unknown,
        }
    }
}

/// What one read of the identity map says about an id and a token.
enum Check {
    Valid(Arc<Identity>),
    WrongToken,
    Unknown,
}

fn parse_basic(header: &[u8]) -> Option<(String, Vec<u8>)> {
    let text = std::str::from_utf8(header).ok()?.trim();
    let (scheme, encoded) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    // Clients differ on whether they percent-decode the userinfo of a proxy URL before
    // sending it; accept both spellings.
    let id = percent_encoding::percent_decode(&decoded[..colon])
        .decode_utf8_lossy()
        .into_owned();
    let token: Vec<u8> = percent_encoding::percent_decode(&decoded[colon + 1..]).collect();
    Some((id, token))
}

/// One statically registered egress identity: `HTTP_PROXY=http://<id>:<token>@host:port`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// The sandbox id, the user part of the proxy URL.
    pub id: String,
    /// The proxy password. Prefer `token_env` so the file holds no secret.
    #[serde(default)]
    pub token: Option<String>,
    /// Name of an environment variable holding the token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Workspace the sandbox belongs to.
    pub workspace: String,
    /// Domains this sandbox may reach: exact names or `*.suffix` wildcards.
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// Free-form labels, visible to policy as `input.sandbox.labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The user within the workspace the sandbox acts for (binds that user's credentials).
    #[serde(default)]
    pub user: Option<String>,
    /// Names of credentials of this workspace (or user) applied to this sandbox's traffic.
    #[serde(default)]
    pub credentials: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, pass: &str) -> Vec<u8> {
        let enc = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        format!("Basic {enc}").into_bytes()
    }

    #[test]
    fn authenticates_only_the_right_token() {
        let r = IdentityRegistry::default();
        r.register(Identity::new(
            "sb1",
            "s3cret-token",
            "ws",
            vec![],
            BTreeMap::new(),
        ));
        assert_eq!(
            r.authenticate(Some(&basic("sb1", "s3cret-token")))
                .unwrap()
                .id,
            "sb1"
        );
        assert!(r.authenticate(Some(&basic("sb1", "wrong-token"))).is_none());
        assert!(r
            .authenticate(Some(&basic("sb2", "s3cret-token")))
            .is_none());
        assert!(r.authenticate(Some(b"Bearer x")).is_none());
        assert!(r.authenticate(None).is_none());
        assert!(r.revoke("sb1"));
        assert!(r
            .authenticate(Some(&basic("sb1", "s3cret-token")))
            .is_none());
    }

    #[test]
    fn percent_encoded_userinfo_is_accepted() {
        let r = IdentityRegistry::default();
        r.register(Identity::new("sb1", "a:b@c", "ws", vec![], BTreeMap::new()));
        assert!(r.authenticate(Some(&basic("sb1", "a%3Ab%40c"))).is_some());
    }

    #[test]
    fn revoking_or_replacing_an_identity_cancels_the_old_one() {
        let r = IdentityRegistry::default();
        r.register(Identity::new("sb1", "t1", "ws", vec![], BTreeMap::new()));
        let first = r.get("sb1").unwrap();
        assert!(!first.is_revoked());
        r.register(Identity::new("sb1", "t2", "ws", vec![], BTreeMap::new()));
        assert!(first.is_revoked(), "a replaced identity's tunnels must end");
        let second = r.get("sb1").unwrap();
        assert!(!second.is_revoked());
        assert!(r.revoke("sb1"));
        assert!(second.is_revoked());
        assert!(second.revocation().is_cancelled());
        assert!(!r.revoke("sb1"));
    }

    #[test]
    fn a_registration_from_a_read_older_than_a_revocation_is_refused() {
        let r = IdentityRegistry::default();
        let id = |t: &str| Identity::new("sb1", t, "ws", vec![], BTreeMap::new());
        // A follower reads the store (sandbox running), then a delete revokes: the stale
        // read must not bring the token back.
        let mark = r.mark();
        r.revoke("sb1");
        assert!(!r.register_unless_revoked_since(id("t1"), mark));
        assert!(r.get("sb1").is_none());
        // A read taken after the revocation registers; a second one keeps the first.
        let mark = r.mark();
        assert!(r.register_unless_revoked_since(id("t1"), mark));
        let served = r.get("sb1").unwrap();
        assert!(!r.register_unless_revoked_since(id("t2"), mark));
        assert!(!served.is_revoked(), "an identity served is not replaced");
        // Configured identities are not sandboxes.
        assert_eq!(r.sandbox_ids(), ["sb1"]);
    }

    proptest::proptest! {
        #[test]
        fn any_proxy_authorization_bytes_are_handled(header in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96)) {
            let r = IdentityRegistry::default();
            r.register(Identity::new("sb1", "tok", "ws", vec![], BTreeMap::new()));
            let _ = r.authenticate(Some(&header));
            let mut basic = b"Basic ".to_vec();
            basic.extend_from_slice(&header);
            let _ = r.authenticate(Some(&basic));
        }
    }

    #[test]
    fn tunnels_are_counted_per_identity_up_to_the_cap() {
        let identity = Arc::new(Identity::new("sb1", "t", "ws", vec![], BTreeMap::new()));
        let a = identity.open_tunnel(2).unwrap();
        let _b = identity.open_tunnel(2).unwrap();
        assert!(identity.open_tunnel(2).is_none());
        assert_eq!(identity.open_tunnels(), 2);
        drop(a);
        assert!(identity.open_tunnel(2).is_some());
    }
}
