//! Resolution of upstream names, once per destination: `[dns] hosts` overrides first, then
//! the system resolver. Every address of an answer is vetted by the [`AddressGuard`] and an
//! answer with any forbidden address is refused whole (a name that mixes public and
//! private answers is a rebinding attempt more often than not), each address checked with
//! the port it will be dialed on. Vetted answers are cached briefly. The proxy resolves a
//! destination once per tunnel (or absolute-form request) and hands the vetted addresses to
//! the upstream connector (`egress::upstream`), which dials only those: the address the
//! policy saw is the address that is dialed, and no second lookup can switch it.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::guard::{AddressGuard, Forbidden};

#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    #[error("{host} does not resolve: {reason}")]
    Lookup { host: String, reason: String },
    #[error("{host} resolves to {ip}, a {} address sandboxes may not reach", .why.as_str())]
    Forbidden {
        host: String,
        ip: IpAddr,
        why: Forbidden,
    },
}

#[derive(Debug)]
pub struct Resolver {
    overrides: BTreeMap<String, IpAddr>,
    guard: AddressGuard,
    ttl: Duration,
    cache: quick_cache::sync::Cache<String, (Arc<[IpAddr]>, Instant)>,
}

impl Resolver {
    pub fn new(overrides: BTreeMap<String, IpAddr>, guard: AddressGuard, ttl: Duration) -> Self {
        let overrides = overrides
            .into_iter()
            .map(|(k, v)| (crate::domain::normalize_host(&k), v))
            .collect();
        Resolver {
            overrides,
            guard,
            ttl,
            cache: quick_cache::sync::Cache::new(4096),
        }
    }

    /// The vetted addresses of `host` for a connection to `port`.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Arc<[IpAddr]>, ResolveError> {
        let ips = self.lookup(host).await?;
        for ip in ips.iter() {
            self.guard
                .check(SocketAddr::new(*ip, port))
                .map_err(|why| ResolveError::Forbidden {
                    host: host.to_string(),
                    ip: *ip,
                    why,
                })?;
        }
        Ok(ips)
    }

    async fn lookup(&self, host: &str) -> Result<Arc<[IpAddr]>, ResolveError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Arc::from([ip]));
        }
        if let Some(ip) = self.overrides.get(host) {
            return Ok(Arc::from([*ip]));
        }
        if let Some((ips, at)) = self.cache.get(host) {
            if at.elapsed() < self.ttl {
                return Ok(ips);
            }
        }
        let lookup_err = |reason: String| ResolveError::Lookup {
            host: host.to_string(),
            reason,
        };
        let addrs = tokio::net::lookup_host((host, 0))
            .await
            .map_err(|e| lookup_err(e.to_string()))?;
        let mut ips: Vec<IpAddr> = Vec::new();
        for addr in addrs {
            if !ips.contains(&addr.ip()) {
                ips.push(addr.ip());
            }
        }
        if ips.is_empty() {
            return Err(lookup_err("no addresses".into()));
        }
        let ips: Arc<[IpAddr]> = ips.into();
        self.cache
            .insert(host.to_string(), (ips.clone(), Instant::now()));
        Ok(ips)
    }
}

/// The gateway's own HTTP clients (token endpoints) resolve through the [`Resolver`] too:
/// `[dns] hosts` applies to them, and an address a sandbox could not reach is refused, so a
/// credential's `token_url` cannot point sandgate at the metadata service or a private
/// network the proxy itself keeps sandboxes out of.
pub struct VettedDns(pub Arc<Resolver>);

impl reqwest::dns::Resolve for VettedDns {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let resolver = self.0.clone();
        Box::pin(async move {
            // The port is the URL's, set by the client afterwards; addresses are vetted as
            // HTTPS ones.
            let ips = resolver.resolve(name.as_str(), 443).await?;
            let addrs: Vec<SocketAddr> = ips.iter().map(|ip| SocketAddr::new(*ip, 0)).collect();
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn overrides_are_vetted_like_any_answer() {
        let mut hosts = BTreeMap::new();
        hosts.insert("meta.test".to_string(), "169.254.169.254".parse().unwrap());
        hosts.insert("api.test".to_string(), "127.0.0.1".parse().unwrap());
        let guard = AddressGuard::new(vec!["127.0.0.0/8".parse().unwrap()], vec![]);
        let r = Resolver::new(hosts, guard, Duration::from_secs(30));
        assert!(r.resolve("api.test", 443).await.is_ok());
        let err = r.resolve("meta.test", 443).await.unwrap_err();
        assert!(
            matches!(
                err,
                ResolveError::Forbidden {
                    why: Forbidden::Metadata,
                    ..
                }
            ),
            "{err}"
        );
        let err = r.resolve("10.0.0.1", 443).await.unwrap_err();
        assert!(
            matches!(
                err,
                ResolveError::Forbidden {
                    why: Forbidden::Private,
                    ..
                }
            ),
            "{err}"
        );
    }
}
