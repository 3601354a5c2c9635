//! Egress identities: which sandbox a proxy connection speaks for.
//!
//! A sandbox proves who it is with `Proxy-Authorization: Basic base64(id:token)`, which is
//! what every standard client sends for `HTTP_PROXY=http://id:token@host:port`. Static
//! identities come from config; sandboxes created through the API register at runtime and
//! are revoked on deletion. Tokens are compared in constant time, and an unknown id costs
//! the same comparison as a known one so response timing does not reveal which ids exist.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use subtle::ConstantTimeEq;

use crate::config::IdentityConfig;

/// The sandbox context attached to every decision made for a connection.
#[derive(Debug)]
pub struct Identity {
    pub id: String,
    pub workspace: String,
    /// The user in the workspace the sandbox acts for, if any.
    pub user: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub allow_domains: Vec<String>,
    /// Credentials of the workspace (or user) applied to this sandbox's traffic.
    pub bindings: Vec<Binding>,
    token: Vec<u8>,
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
            token: token.into(),
        }
    }
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
        credentials: &crate::credentials::CredentialStore,
        key_path: impl Fn(usize) -> String,
    ) -> Result<Identity, IdentityError> {
        self.user = user;
        for (i, name) in names.iter().enumerate() {
            let Some(credential) = credentials.get(&self.workspace, name) else {
                return Err(IdentityError::Binding {
                    key: key_path(i),
                    message: format!("no credential {name:?} in workspace {:?}", self.workspace),
                });
            };
            if credential.meta.user.is_some() && credential.meta.user != self.user {
                return Err(IdentityError::Binding {
                    key: key_path(i),
                    message: format!(
                        "credential {name:?} belongs to another user of workspace {:?}",
                        self.workspace
                    ),
                });
            }
            let placeholder = credentials
                .key()
                .placeholder(&self.id, &self.workspace, name);
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
}

impl IdentityRegistry {
    pub fn from_config(
        identities: &[IdentityConfig],
        credentials: &crate::credentials::CredentialStore,
    ) -> Result<IdentityRegistry, IdentityError> {
        let registry = IdentityRegistry::default();
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

    pub fn register(&self, identity: Identity) {
        let mut map = self.by_id.write().unwrap_or_else(|e| e.into_inner());
        map.insert(identity.id.clone(), Arc::new(identity));
    }

    /// Revokes an identity; connections already authenticated keep their `Arc` but every
    /// new connection is refused.
    pub fn revoke(&self, id: &str) -> bool {
        let mut map = self.by_id.write().unwrap_or_else(|e| e.into_inner());
        map.remove(id).is_some()
    }

    pub fn get(&self, id: &str) -> Option<Arc<Identity>> {
        self.by_id
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.by_id.read().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Authenticates a `Proxy-Authorization` header value.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Option<Arc<Identity>> {
        let (id, token) = parse_basic(header?)?;
        let found = {
            let map = self.by_id.read().unwrap_or_else(|e| e.into_inner());
            map.get(&id).cloned()
        };
        // Compare against a dummy of the same length when the id is unknown, so an
        // attacker cannot tell unknown ids from wrong tokens by timing.
        const DUMMY: [u8; 32] = [0u8; 32];
        let expected: &[u8] = found.as_ref().map(|i| i.token.as_slice()).unwrap_or(&DUMMY);
        let equal: bool = expected.ct_eq(token.as_slice()).into();
        match found {
            Some(identity) if equal => Some(identity),
            _ => None,
        }
    }
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
    let id = percent_decode(&decoded[..colon]);
    let token = percent_decode(&decoded[colon + 1..]).into_bytes();
    Some((id, token))
}

/// Clients differ on whether they percent-decode the userinfo of a proxy URL before
/// sending it; accept both spellings.
fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
}
