//! `[proxy]`, owned by the egress proxy: listeners, connection and tunnel limits, timeouts,
//! and the TLS listener's certificate and public URL.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::Deserialize;

use crate::base::ConfigError;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Address the egress proxy listens on.
    pub listen: SocketAddr,
    /// Concurrent client connections, each counted for as long as anything it started lives
    /// (a CONNECT tunnel included); beyond this new connections are shed with 503.
    pub max_connections: usize,
    /// Open CONNECT tunnels one sandbox identity may hold at once; its next CONNECT is
    /// refused with 429 `too_many_tunnels`, so one sandbox cannot take every connection.
    /// Must be below `max_connections`; unset, it is derived from it (see
    /// [`ProxyConfig::tunnels_per_identity`]).
    pub max_tunnels_per_identity: Option<usize>,
    /// Largest request head (request line plus headers) accepted from a sandbox, in bytes.
    pub max_header_bytes: usize,
    /// Seconds a client may take to send a complete request head.
    pub header_read_timeout_secs: u64,
    /// Seconds an intercepted tunnel with nothing in flight may sit without any traffic
    /// before it is closed (parked meanwhile, see `egress::park`); also the longest wait for
    /// an upstream's response head.
    pub idle_timeout_secs: u64,
    /// Upper bound on the lifetime of one CONNECT tunnel, in seconds.
    pub tunnel_max_secs: u64,
    /// Seconds allowed to open a TCP connection to an upstream.
    pub connect_timeout_secs: u64,
    /// Threads serving proxy connections, each with its own single-threaded event loop: a
    /// connection, its requests and their upstream connections stay on one thread, so no
    /// request crosses threads (see `egress::workers`). 0: one per core available.
    pub workers: usize,
    /// A second proxy listener that speaks TLS (an `https://` proxy), for sandboxes that
    /// reach sandgate across a network (hosted providers): their proxy credentials then
    /// never cross it in clear. The same proxy as `listen` (identities, policy, limits).
    pub tls_listen: Option<SocketAddr>,
    /// The TLS listener's certificate chain (PEM), with `tls_key_file`; both or neither.
    /// Without them the certificate is issued by sandgate's own CA for `public_name`.
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// The DNS name or IP address the TLS listener's certificate is issued for by sandgate's
    /// own CA (the interception CA sandboxes trust anyway), when no certificate files are
    /// given. Defaults to the host of `public_url`.
    pub public_name: Option<String>,
    /// The proxy address hosted sandboxes are given (their `HTTP(S)_PROXY` is this with
    /// `<id>:<token>@` added), e.g. `https://gw.example.com:3129`: an `http` or `https` URL
    /// with a host and an explicit port and nothing else.
    pub public_url: Option<String>,
    /// Seconds a client of the TLS listener may take to complete its TLS handshake.
    pub tls_handshake_timeout_secs: u64,
    /// How a CONNECT to a refused destination is answered (see `egress::deny_tunnel`):
    /// `in_tunnel` (accept the tunnel and answer every request inside it with the 403 JSON
    /// body, so clients that drop CONNECT bodies show the reason) or `connect` (the plain
    /// CONNECT 403). The egress decision's `deny_mode` overrides it per destination.
    pub deny_mode: DenyMode,
    /// Leaves one sandbox identity may have minted per minute for refused names answered
    /// in the tunnel; beyond it the next refusal is the plain CONNECT 403. A name whose
    /// leaf is already cached costs nothing. Bounds the CPU a sandbox asking for random
    /// names can cost.
    pub deny_leaves_per_minute: u32,
}

/// How a refused CONNECT is answered (`[proxy] deny_mode`, or the decision's `deny_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyMode {
    /// `200`, then a 403 with the JSON reason for each request inside the tunnel.
    #[default]
    InTunnel,
    /// The CONNECT itself answered 403 (its body is what most clients never show).
    Connect,
}

impl DenyMode {
    /// The mode a policy value names (`"in_tunnel"` or `"connect"`), if any.
    pub fn parse(text: &str) -> Option<DenyMode> {
        match text {
            "in_tunnel" => Some(DenyMode::InTunnel),
            "connect" => Some(DenyMode::Connect),
            _ => None,
        }
    }
}

/// The most tunnels one identity holds by default, however large `max_connections` is.
pub const DEFAULT_MAX_TUNNELS_PER_IDENTITY: usize = 256;

impl ProxyConfig {
    /// Open tunnels one identity may hold: `max_tunnels_per_identity`, or by default a
    /// quarter of `max_connections` (at most 256, at least 1). A share below the whole cap
    /// is what keeps one sandbox from holding every connection and leaving the others none:
    /// with the default, at least four sandboxes fit before the proxy is full.
    pub fn tunnels_per_identity(&self) -> usize {
        self.max_tunnels_per_identity.unwrap_or_else(|| {
            (self.max_connections / 4).clamp(1, DEFAULT_MAX_TUNNELS_PER_IDENTITY)
        })
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 3128)),
            max_connections: 4096,
            max_tunnels_per_identity: None,
            max_header_bytes: 64 * 1024,
            header_read_timeout_secs: 10,
            idle_timeout_secs: 300,
            tunnel_max_secs: 6 * 3600,
            connect_timeout_secs: 10,
            workers: 0,
            tls_listen: None,
            tls_cert_file: None,
            tls_key_file: None,
            public_name: None,
            public_url: None,
            tls_handshake_timeout_secs: 10,
            deny_mode: DenyMode::InTunnel,
            deny_leaves_per_minute: 60,
        }
    }
}

/// Where the TLS proxy listener's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyCertificate {
    /// `tls_cert_file` and `tls_key_file`.
    Files { cert: PathBuf, key: PathBuf },
    /// Issued (and renewed) by sandgate's CA for this DNS name or IP address.
    Issued { name: String },
}

/// `[proxy] public_url`, checked: scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    /// `http` or `https`.
    pub scheme: String,
    /// The host as written (an IPv6 address keeps its brackets).
    pub host: String,
    pub port: u16,
}

impl PublicUrl {
    /// Parses an `http(s)://host:port` URL (an optional trailing `/`, nothing else).
    pub fn parse(text: &str) -> Result<PublicUrl, String> {
        let uri: http::Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        let scheme = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some(s @ ("http" | "https")) => s.to_string(),
            _ => return Err(format!("{text:?}: the scheme must be https (or http)")),
        };
        let Some(authority) = uri.authority() else {
            return Err(format!("{text:?} has no host"));
        };
        if authority.as_str().contains('@') {
            return Err(format!(
                "{text:?} carries credentials; each sandbox's are added to it"
            ));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(format!("{text:?} has no host"));
        }
        let Some(port) = authority.port_u16() else {
            return Err(format!("{text:?} needs an explicit port"));
        };
        if port == 0 {
            return Err(format!("{text:?}: port 0 is not a port"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(format!(
                "{text:?}: a proxy URL has no path or query, only scheme, host and port"
            ));
        }
        Ok(PublicUrl {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// `scheme://host:port`
    pub fn base(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.host, self.port)
    }
}

impl ProxyConfig {
    /// The TLS listener's certificate source, when `tls_listen` is set (after validation).
    pub fn tls_certificate(&self) -> Option<ProxyCertificate> {
        self.tls_listen?;
        if let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) {
            return Some(ProxyCertificate::Files {
                cert: cert.clone(),
                key: key.clone(),
            });
        }
        let name = self.public_name.clone().or_else(|| {
            let url = PublicUrl::parse(self.public_url.as_deref()?).ok()?;
            Some(
                url.host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
            )
        })?;
        Some(ProxyCertificate::Issued { name })
    }

    /// `public_url`, parsed (after validation).
    pub fn public_url(&self) -> Option<PublicUrl> {
        PublicUrl::parse(self.public_url.as_deref()?).ok()
    }

    pub(crate) fn validate_tls(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.public_url {
            PublicUrl::parse(url).map_err(|m| ConfigError::invalid("proxy.public_url", m))?;
        }
        if let Some(name) = &self.public_name {
            check_public_name(name).map_err(|m| ConfigError::invalid("proxy.public_name", m))?;
        }
        if self.tls_handshake_timeout_secs == 0 {
            return Err(ConfigError::invalid(
                "proxy.tls_handshake_timeout_secs",
                "must be at least 1",
            ));
        }
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => {
                return Err(ConfigError::invalid(
                    "proxy.tls_key_file",
                    "required with proxy.tls_cert_file (set both or neither)",
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::invalid(
                    "proxy.tls_cert_file",
                    "required with proxy.tls_key_file (set both or neither)",
                ))
            }
            _ => {}
        }
        let Some(tls_listen) = self.tls_listen else {
            for (key, set) in [
                ("proxy.tls_cert_file", self.tls_cert_file.is_some()),
                ("proxy.public_name", self.public_name.is_some()),
            ] {
                if set {
                    return Err(ConfigError::invalid(
                        key,
                        "has no effect without proxy.tls_listen",
                    ));
                }
            }
            return Ok(());
        };
        if tls_listen == self.listen && tls_listen.port() != 0 {
            return Err(ConfigError::invalid(
                "proxy.tls_listen",
                "must differ from proxy.listen",
            ));
        }
        if self.tls_cert_file.is_some() {
            if self.public_name.is_some() {
                return Err(ConfigError::invalid(
                    "proxy.public_name",
                    "names the certificate sandgate issues; with proxy.tls_cert_file the certificate is yours (set one or the other)",
                ));
            }
            return Ok(());
        }
        match self.tls_certificate() {
            Some(ProxyCertificate::Issued { name }) => check_public_name(&name)
                .map_err(|m| ConfigError::invalid("proxy.public_url", m)),
            _ => Err(ConfigError::invalid(
                "proxy.public_name",
                "proxy.tls_listen needs a certificate: set public_name (or public_url) for one issued by sandgate's CA, or tls_cert_file and tls_key_file",
            )),
        }
    }
}

/// A name a certificate can be issued for: an IP address or a DNS name (no wildcard).
fn check_public_name(name: &str) -> Result<(), String> {
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a DNS name or IP address"))
    }
}
