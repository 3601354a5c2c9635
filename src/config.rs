//! `sandgate.toml`: every key has a default, so an empty file (or none) runs the embedded
//! defaults. Unknown keys are rejected rather than ignored, because a misspelt security
//! setting that silently falls back to a default is worse than a refusal to start.
//!
//! A section read by one module is defined in that module (`[store]` in `store`, `[proxy]` in
//! `egress`, `[log]` in `telemetry`, `[local]` in `providers::local`, identities in
//! `identity`) and re-exported here; this file assembles the sections, fills defaults and
//! checks rules that span several. Lower modules never import it, so it sits above them.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;

pub use crate::base::ConfigError;
pub use crate::egress::config::{
    ProxyCertificate, ProxyConfig, PublicUrl, DEFAULT_MAX_TUNNELS_PER_IDENTITY,
};
pub use crate::identity::IdentityConfig;
pub use crate::providers::local::LocalConfig;
pub use crate::store::StoreConfig;
pub use crate::telemetry::LogConfig;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The egress proxy that sandboxes reach through `HTTP_PROXY`/`HTTPS_PROXY`.
    pub proxy: ProxyConfig,
    /// The control-plane HTTP API (health, metrics, and later sandboxes).
    pub api: ApiConfig,
    /// The interception CA and the roots trusted for upstream servers.
    pub tls: TlsConfig,
    /// Name resolution for upstream destinations.
    pub dns: DnsConfig,
    /// Egress rules that are not Rego: the private-address guard and static identities.
    pub egress: EgressConfig,
    /// Where the Rego policies live and how they are reloaded.
    pub policy: PolicyConfig,
    /// Diagnostic logs and the decision log.
    pub log: LogConfig,
    /// OpenTelemetry export (traces over OTLP); off by default.
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// Durable state (credentials, sandboxes).
    pub store: StoreConfig,
    /// The master key that seals secrets at rest.
    pub secrets: SecretsConfig,
    /// Credentials declared in the file; their secrets come from the environment or a file.
    pub credentials: Vec<crate::credentials::CredentialConfig>,
    /// `[[providers]]`: sandbox services (kind, declared capabilities); see `sandgate-router`.
    pub providers: Vec<sandgate_router::ProviderConfig>,
    /// `[[accounts]]`: provider accounts (credential reference, billing standing, labels).
    pub accounts: Vec<sandgate_router::AccountConfig>,
    /// `[[pools]]`: capacity on one provider and account that sandboxes are placed in.
    pub pools: Vec<sandgate_router::PoolConfig>,
    /// `[simulated.<pool>]`: behaviour of pools whose provider kind is `simulated` (a test and
    /// demo provider; no pool uses it unless configured).
    pub simulated: BTreeMap<String, crate::providers::simulated::SimulatedPoolConfig>,
    /// Sandbox creation: response wait, idempotency, janitor, routing statistics.
    pub create: CreateConfig,
    /// The `kind = "local"` provider: namespaced sandboxes on this machine.
    pub local: LocalConfig,
    /// `[e2b]`: the E2B-compatible API (off unless `listen` is set), for the official E2B
    /// SDKs; see `crate::facade`.
    pub e2b: E2bConfig,
    /// `[ports]`: sandbox ports served at `https://{port}-{sandbox}.{domain}` (local
    /// sandboxes); see `crate::ports`.
    pub ports: PortsConfig,
    /// What this process serves (`sandgate serve --role`, `SANDGATE_ROLE`); not a file key,
    /// so one configuration file serves every role of a deployment.
    #[serde(skip)]
    pub role: Role,
}

/// The planes one `sandgate serve` process runs, so that the proxy plane and the control
/// plane can scale separately behind their own load balancers.
///
/// | role | egress proxy listeners | API | creates, janitor, account checks |
/// |---|---|---|---|
/// | `all` (default) | yes | every route | yes |
/// | `api` | no | every route | yes |
/// | `proxy` | yes | `/livez`, `/readyz`, `/healthz`, `/metrics` only | no |
///
/// Every role answers the probes on the API listener (`[api] listen`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    All,
    Api,
    Proxy,
}

impl Role {
    pub fn serves_proxy(self) -> bool {
        matches!(self, Role::All | Role::Proxy)
    }

    pub fn serves_api(self) -> bool {
        matches!(self, Role::All | Role::Api)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Api => "api",
            Role::Proxy => "proxy",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CreateConfig {
    /// How long `POST /v1/sandboxes` waits for placement before answering `202` (the create
    /// continues in the background), in milliseconds.
    pub short_wait_ms: u64,
    /// How long an `Idempotency-Key` keeps returning the same sandbox, in seconds.
    pub idempotency_ttl_secs: u64,
    /// How often the janitor runs (late instances, expired leases, expired keys), in ms.
    pub janitor_interval_ms: u64,
    /// Window of startup-latency and success samples the router ranks with, in seconds.
    pub stats_window_secs: u64,
    /// Time within which retryable failures (rate limit, provider error) are retried on the
    /// same pool before the route advances, in milliseconds.
    pub provisioning_window_ms: u64,
    /// The first pause between retries on one pool, in milliseconds; each further pause
    /// doubles (with jitter) up to `retry_backoff_max_ms`. A longer `Retry-After` is waited
    /// instead, unless it ends past the provisioning window: then the route advances at once.
    pub retry_backoff_ms: u64,
    /// The longest pause between two retries on one pool, in milliseconds.
    pub retry_backoff_max_ms: u64,
    /// Retries of one attempt on one pool at most (so `retry_max + 1` create calls).
    pub retry_max: u32,
    /// Consecutive failed create calls on a pool (outage, provider error, rate limit, unknown)
    /// that open its circuit: creates then skip the pool (see `create::circuit`). 0 turns
    /// the breaker off.
    pub circuit_failure_threshold: u32,
    /// How long an open circuit stays open before one create is let through as a probe, in
    /// milliseconds.
    pub circuit_open_ms: u64,
    /// After an unknown outcome, how long the provider is asked for the tagged instance
    /// before the attempt is abandoned and the route advances, in milliseconds.
    pub reconcile_window_ms: u64,
    /// How long the janitor keeps looking for a late instance of an abandoned attempt, in
    /// seconds.
    pub abandoned_watch_secs: u64,
    /// The longest pause between two lookups of one abandoned attempt by the janitor, in
    /// seconds: the first comes at the next pass, then each pause doubles from
    /// `janitor_interval_ms` up to this.
    pub abandoned_check_max_secs: u64,
    /// Lease on an in-flight create; another coordinator (or this one after a restart)
    /// resumes it once the lease expires, in milliseconds.
    pub lease_ttl_ms: u64,
    /// Startup-latency band width for ranking, in milliseconds.
    pub startup_latency_band_ms: f64,
    /// Creation-success band width for ranking, as a share (0.05 = 5 points).
    pub creation_success_band: f64,
    /// Each workspace's Auto order: the providers (names from `[[providers]]`, or
    /// `"standby"`) its automatic creates try, in this order; a provider it omits is not
    /// used. A create's own `routing.order` overrides it.
    pub workspace_order: BTreeMap<String, Vec<String>>,
    /// How often each hosted account is checked (one harmless authenticated call, as
    /// `sandgate provider check` makes) for `GET /v1/pools`, in seconds; the first check
    /// runs in the background at start. `0` turns checks off (accounts show `not_checked`).
    pub account_check_interval_secs: u64,
    /// Concurrent `GET /v1/sandboxes/{id}/events` streams at most; beyond it new ones are
    /// answered 429 `rate_limited` (each open stream polls the store).
    pub event_streams_max: usize,
    /// Longest life of one event stream, in seconds, so a stream on a stuck create ends; the
    /// client reconnects with `Last-Event-ID` to go on.
    pub event_stream_max_secs: u64,
    /// How often every running sandbox's instance is looked up at its provider (one ended
    /// by the provider becomes `failed`, its egress revoked) and its provider-side clock
    /// extended, in seconds; `0` turns the pass off. See `create::liveness`.
    pub liveness_interval_secs: u64,
}

impl Default for CreateConfig {
    fn default() -> Self {
        CreateConfig {
            short_wait_ms: 2000,
            idempotency_ttl_secs: 24 * 3600,
            janitor_interval_ms: 5000,
            stats_window_secs: 3600,
            provisioning_window_ms: 30_000,
            retry_backoff_ms: 200,
            retry_backoff_max_ms: 5000,
            retry_max: 3,
            circuit_failure_threshold: 5,
            circuit_open_ms: 30_000,
            reconcile_window_ms: 5000,
            abandoned_watch_secs: 24 * 3600,
            abandoned_check_max_secs: 3600,
            lease_ttl_ms: 15_000,
            startup_latency_band_ms: 250.0,
            creation_success_band: 0.05,
            workspace_order: BTreeMap::new(),
            account_check_interval_secs: 300,
            event_streams_max: 256,
            event_stream_max_secs: 15 * 60,
            liveness_interval_secs: 60,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// Key file used when `SANDGATE_MASTER_KEY` is not set; generated (mode 0600) if missing.
    /// This key seals; see `accepted_key_files` for a rotation.
    pub master_key_file: PathBuf,
    /// Key files that open (never seal) secrets: the old key while a rotation is under way
    /// (`sandgate store rekey`), or the new one before it becomes current. Also
    /// `SANDGATE_ACCEPTED_MASTER_KEYS`.
    pub accepted_key_files: Vec<PathBuf>,
}

impl Default for SecretsConfig {
    fn default() -> Self {
        SecretsConfig {
            master_key_file: PathBuf::from("data/master.key"),
            accepted_key_files: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Address the API listens on (`/healthz`, `/metrics`, `/v1/...`).
    pub listen: SocketAddr,
    /// Bearer tokens accepted by `/v1` endpoints and the principal each stands for.
    pub tokens: Vec<ApiTokenConfig>,
    /// With no `tokens`, generate one admin token (principal `local-admin`, workspace
    /// `default`) into `api-token` next to the database (mode 0600), so the CLI on this
    /// machine works on the embedded defaults. `false`: no tokens, every `/v1` call is 401.
    pub generate_local_token: bool,
    /// Concurrent API connections; beyond this new ones get 503 `overloaded` and are closed.
    pub max_connections: usize,
    /// Concurrent API connections from one peer address (the same answer beyond it), so one
    /// client flooding the port leaves the others (and `/healthz` probes) served.
    pub max_connections_per_ip: usize,
    /// Seconds a client may take to send a request head, counted from when the connection
    /// is ready for one (so also the longest an idle keep-alive connection waits).
    pub header_read_timeout_secs: u64,
    /// Seconds a connection with no request in flight and no traffic stays open.
    pub idle_timeout_secs: u64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            tokens: Vec::new(),
            generate_local_token: true,
            max_connections: 1024,
            max_connections_per_ip: 128,
            header_read_timeout_secs: 10,
            idle_timeout_secs: 60,
        }
    }
}

/// `[e2b]`: the E2B-compatible facade. Every call becomes the sandgate operation it names,
/// through the same router, coordinator and policy layers as `/v1`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct E2bConfig {
    /// Where the facade listens (control plane and envd on one origin): the SDKs'
    /// `E2B_API_URL` and `E2B_SANDBOX_URL`. Unset: no facade. Also `sandgate serve
    /// --e2b-listen`.
    pub listen: Option<SocketAddr>,
    /// The `domain` answered to the SDKs; envd is also reached as `49983-<id>.<domain>`
    /// through a wildcard DNS name pointing at `listen`. While the ports gateway serves
    /// (`[ports]`), the SDKs are told its domain instead (with its port unless 443), so that
    /// `get_host(port)` names the gateway's host for that port; they then reach envd through
    /// `E2B_SANDBOX_URL` (this facade's origin), as the SDKs are pointed anyway.
    pub domain: String,
    /// `X-API-Key` values (`e2b_<hex>`) and the principal each stands for.
    pub api_keys: Vec<E2bKeyConfig>,
    /// With no `api_keys`, generate one key for the local admin (principal `local-admin`,
    /// workspace `default`) into `e2b-api-key` next to the database (mode 0600), as
    /// `[api] generate_local_token` does for the API.
    pub generate_local_key: bool,
    /// `templateID` → what to create. A template not listed here is refused, except
    /// `base` (the SDKs' default), which creates the pool's default source.
    pub templates: BTreeMap<String, E2bTemplate>,
    /// The egress allow list (domains, `*.suffix` patterns, addresses or CIDRs) a sandbox
    /// created through the facade gets when the SDK's create says nothing about the network:
    /// sandgate sandboxes reach nothing by default, E2B's reach everything. A template's
    /// `allow_out` wins over the API key's, which wins over this one. Empty: nothing.
    pub allow_out: Vec<String>,
}

impl E2bConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        for (i, key) in self.api_keys.iter().enumerate() {
            if let Some(k) = &key.key {
                if !valid_e2b_key(k) {
                    return Err(ConfigError::invalid(
                        format!("e2b.api_keys[{i}].key"),
                        "must be `e2b_` followed by 20 to 128 hex digits",
                    ));
                }
            }
            if key.key.is_none() && key.key_env.is_none() {
                return Err(ConfigError::invalid(
                    format!("e2b.api_keys[{i}]"),
                    "needs key or key_env",
                ));
            }
        }
        let lists = std::iter::once(("e2b.allow_out".to_string(), Some(&self.allow_out)))
            .chain(
                self.api_keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| (format!("e2b.api_keys[{i}].allow_out"), k.allow_out.as_ref())),
            )
            .chain(self.templates.iter().map(|(name, t)| {
                (
                    format!("e2b.templates.{name}.allow_out"),
                    t.allow_out.as_ref(),
                )
            }));
        for (key, list) in lists {
            if let Some(message) = list.and_then(|l| allow_out_problem(l)) {
                return Err(ConfigError::invalid(key, message));
            }
        }
        if sandgate_router::check_text(&self.domain, 253, false).is_some()
            || self.domain.is_empty()
            || self.domain.contains(['/', ':', ' '])
        {
            return Err(ConfigError::invalid("e2b.domain", "must be a DNS name"));
        }
        Ok(())
    }
}

/// Where the listener binds when `listen` is not set.
pub const DEFAULT_PORTS_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7443);

/// `[ports]`, read by the ports gateway (`crate::ports`): its listener, the domain ports
/// are named under, its certificate and its connection limits. Defined here, not in
/// `ports`, which sits above the operations layer (as `[e2b]` for the facade).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortsConfig {
    /// Serve the ports of local sandboxes at `https://{port}-{sandbox}.{domain}`. When the
    /// listener cannot serve, the local pools declare `features.public_ports = false`.
    pub enabled: bool,
    /// Where the HTTPS listener binds. Unset: `127.0.0.1:7443`, and a start that finds it
    /// taken says so and serves without ports; set, a failure to bind fails the start.
    pub listen: Option<SocketAddr>,
    /// The domain ports are named under: `{port}-{sandbox id}.{domain}`. At least two labels
    /// (a `*.` wildcard certificate for one label is refused by clients). The default,
    /// under `localhost`, resolves to loopback in browsers and curl (RFC 6761); elsewhere
    /// point a wildcard DNS record `*.{domain}` at the listener.
    pub domain: String,
    /// The port URLs name, when clients reach the listener through another one (a load
    /// balancer on 443). Unset: the listener's own. 443 is left out of URLs.
    pub public_port: Option<u16>,
    /// The listener's certificate chain (PEM) for `*.{domain}`, with `tls_key_file`; both
    /// or neither. Without them the certificate is issued by sandgate's own CA
    /// (`[tls] ca_dir`), which clients then trust (`curl --cacert <ca_dir>/ca.pem`).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// At most this many client connections at once; more are closed at accept.
    pub max_connections: usize,
    /// Seconds a client may take to complete its TLS handshake, and then to send each
    /// request head.
    pub header_read_timeout_secs: u64,
}

impl Default for PortsConfig {
    fn default() -> Self {
        PortsConfig {
            enabled: true,
            listen: None,
            domain: "sandgate.localhost".into(),
            public_port: None,
            tls_cert_file: None,
            tls_key_file: None,
            max_connections: 1024,
            header_read_timeout_secs: 10,
        }
    }
}

impl PortsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(message) = ports_domain_problem(&self.domain) {
            return Err(ConfigError::invalid("ports.domain", message));
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(ConfigError::invalid(
                "ports.tls_cert_file",
                "set both tls_cert_file and tls_key_file, or neither",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid(
                "ports.max_connections",
                "must be at least 1",
            ));
        }
        if self.header_read_timeout_secs == 0 {
            return Err(ConfigError::invalid(
                "ports.header_read_timeout_secs",
                "must be at least 1",
            ));
        }
        if self.public_port == Some(0) {
            return Err(ConfigError::invalid(
                "ports.public_port",
                "must be 1 to 65535",
            ));
        }
        Ok(())
    }

    /// The address to bind, and whether it was configured (then a failure to bind it fails
    /// the start).
    pub fn listen_addr(&self) -> (SocketAddr, bool) {
        match self.listen {
            Some(addr) => (addr, true),
            None => (DEFAULT_PORTS_LISTEN, false),
        }
    }
}

/// What is wrong with a ports domain, if anything: lower-case DNS labels (letters, digits,
/// hyphens), at least two, at most 200 characters, so `{port}-{id}.` still fits a name.
fn ports_domain_problem(domain: &str) -> Option<&'static str> {
    let labels: Vec<&str> = domain.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if domain.len() > 200 || !labels.iter().all(label_ok) {
        Some("must be a lower-case DNS name (letters, digits, hyphens), at most 200 characters")
    } else if labels.len() < 2 {
        Some("needs at least two labels (e.g. sandgate.localhost): clients refuse a wildcard certificate for a single label")
    } else {
        None
    }
}

/// What is wrong with an `allow_out` list, if anything: at most 256 entries, each a host
/// name, a `*.suffix` pattern, an address or a CIDR (what a create's `network` takes; the
/// create checks the rest of its rules).
fn allow_out_problem(list: &[String]) -> Option<String> {
    if list.len() > 256 {
        return Some("at most 256 entries".into());
    }
    list.iter().enumerate().find_map(|(i, entry)| {
        let address =
            entry.parse::<std::net::IpAddr>().is_ok() || entry.parse::<ipnet::IpNet>().is_ok();
        let host = entry.strip_prefix("*.").unwrap_or(entry);
        let name = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        (!address && !name)
            .then(|| format!("entry {i} must be a host name, `*.suffix`, an IP address or a CIDR"))
    })
}

/// `e2b_` and 20 to 128 hex digits: E2B's API key format.
pub fn valid_e2b_key(key: &str) -> bool {
    key.strip_prefix("e2b_").is_some_and(|hex| {
        (20..=128).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

impl Default for E2bConfig {
    fn default() -> Self {
        E2bConfig {
            listen: None,
            domain: "sandgate.localhost".into(),
            api_keys: Vec::new(),
            generate_local_key: true,
            templates: BTreeMap::new(),
            allow_out: Vec::new(),
        }
    }
}

/// One E2B API key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bKeyConfig {
    /// The key itself (`e2b_` and hex); prefer `key_env`.
    #[serde(default)]
    pub key: Option<String>,
    /// Environment variable holding the key.
    #[serde(default)]
    pub key_env: Option<String>,
    pub principal: String,
    pub workspace: String,
    #[serde(default)]
    pub roles: Vec<String>,
    /// The default egress allow list of sandboxes this key creates without a network
    /// (replaces `[e2b] allow_out`; a template's own wins over it).
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
}

/// What one E2B `templateID` creates: the create body's `source`, and optionally a pinned
/// `provider` and `resources` (the fields of `POST /v1/sandboxes`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bTemplate {
    #[serde(default)]
    pub source: Option<sandgate_router::Source>,
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub resources: Option<sandgate_router::Resources>,
    /// The default egress allow list of this template's sandboxes created without a network
    /// (wins over the API key's and `[e2b] allow_out`; `[]`: nothing).
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
}

/// `Authorization: Bearer <token>` → principal.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenConfig {
    /// The token itself; prefer `token_env`.
    #[serde(default)]
    pub token: Option<String>,
    /// Environment variable holding the token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Who the token stands for.
    pub principal: String,
    /// The workspace the principal acts in.
    pub workspace: String,
    /// Roles, e.g. `admin` (platform-wide), `member`.
    #[serde(default)]
    pub roles: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Directory of the interception CA (`ca.pem`, `ca.key`); generated on first start.
    pub ca_dir: PathBuf,
    /// Extra PEM files of roots trusted for upstream servers, added to the public web roots.
    pub upstream_ca_files: Vec<PathBuf>,
    /// Validity of minted leaf certificates, in hours.
    pub leaf_validity_hours: u64,
    /// How many minted leaf certificates are kept.
    pub leaf_cache_capacity: usize,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            ca_dir: PathBuf::from("certs"),
            upstream_ca_files: Vec::new(),
            leaf_validity_hours: 24,
            leaf_cache_capacity: 10_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// Name → IP overrides consulted before the system resolver (like `/etc/hosts`).
    pub hosts: BTreeMap<String, IpAddr>,
    /// Seconds a vetted resolution is reused, so a request and its connection see one answer.
    pub cache_ttl_secs: u64,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            hosts: BTreeMap::new(),
            cache_ttl_secs: 30,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// CIDRs exempt from the private-address guard (e.g. an internal API's range).
    pub allow_private: Vec<IpNet>,
    /// Statically registered sandboxes (managed outside sandgate, or for tests).
    pub identities: Vec<IdentityConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Directory of `.rego` files and `data.json` documents, read recursively.
    pub dir: PathBuf,
    /// How often the directory is checked for changes, in milliseconds (0 disables reload).
    pub reload_interval_ms: u64,
    /// `bytecode` (regorus's VM, the fast default) or `interpreter` (the reference).
    pub evaluator: crate::policy::Evaluator,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            dir: PathBuf::from("policies"),
            reload_interval_ms: 1000,
            evaluator: crate::policy::Evaluator::Bytecode,
        }
    }
}

impl Config {
    /// Reads a TOML file; `None` means the embedded defaults.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            let config = Config::default();
            config.validate()?;
            return Ok(config);
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text)
    }

    /// Parses TOML text. Errors name the offending key as a dotted path.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::parse(text)
            .map_err(|e| ConfigError::invalid("<file>", e.message().to_string()))?;
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let message = e.inner().message().to_string();
            match unknown_field_name(&message) {
                Some(field) => ConfigError::invalid(
                    unknown_key_path(&key, &field),
                    with_suggestion(&field, &message),
                ),
                None => ConfigError::invalid(key, message),
            }
        })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.proxy.max_connections == 0 {
            return Err(ConfigError::invalid(
                "proxy.max_connections",
                "must be at least 1",
            ));
        }
        if let Some(tunnels) = self.proxy.max_tunnels_per_identity {
            if tunnels == 0 {
                return Err(ConfigError::invalid(
                    "proxy.max_tunnels_per_identity",
                    "must be at least 1",
                ));
            }
            if tunnels >= self.proxy.max_connections {
                return Err(ConfigError::invalid(
                    "proxy.max_tunnels_per_identity",
                    format!(
                        "is {tunnels}, but must be below proxy.max_connections ({}): one sandbox holding that many tunnels would leave every other sandbox without a connection. Leave it unset for a quarter of max_connections (at most {DEFAULT_MAX_TUNNELS_PER_IDENTITY}), or set it lower",
                        self.proxy.max_connections
                    ),
                ));
            }
        }
        for (key, value) in [
            ("api.max_connections", self.api.max_connections),
            (
                "api.max_connections_per_ip",
                self.api.max_connections_per_ip,
            ),
            (
                "api.header_read_timeout_secs",
                self.api.header_read_timeout_secs as usize,
            ),
            ("api.idle_timeout_secs", self.api.idle_timeout_secs as usize),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if self.proxy.workers > 1024 {
            return Err(ConfigError::invalid(
                "proxy.workers",
                "must be at most 1024 (0 means one per core)",
            ));
        }
        if self.proxy.max_header_bytes < 1024 {
            return Err(ConfigError::invalid(
                "proxy.max_header_bytes",
                "must be at least 1024",
            ));
        }
        self.proxy.validate_tls()?;
        self.store.validate()?;
        self.e2b.validate()?;
        self.ports.validate()?;
        if self.tls.leaf_validity_hours == 0 || self.tls.leaf_validity_hours > 24 * 90 {
            return Err(ConfigError::invalid(
                "tls.leaf_validity_hours",
                "must be between 1 and 2160",
            ));
        }
        if !["stdout", "stderr", "off"].contains(&self.log.decisions.as_str())
            && self.log.decisions.trim().is_empty()
        {
            return Err(ConfigError::invalid("log.decisions", "must not be empty"));
        }
        if !(1..=1 << 20).contains(&self.log.decisions_queue) {
            return Err(ConfigError::invalid(
                "log.decisions_queue",
                "must be between 1 and 1048576",
            ));
        }
        if !["text", "json"].contains(&self.log.format.as_str()) {
            return Err(ConfigError::invalid(
                "log.format",
                format!(
                    "unknown format {:?}; expected text or json",
                    self.log.format
                ),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, identity) in self.egress.identities.iter().enumerate() {
            let key = |field: &str| format!("egress.identities[{i}].{field}");
            if identity.id.is_empty() || identity.id.contains(':') {
                return Err(ConfigError::invalid(
                    key("id"),
                    "must be non-empty and contain no ':'",
                ));
            }
            if !seen.insert(identity.id.as_str()) {
                return Err(ConfigError::invalid(
                    key("id"),
                    format!("duplicate identity {:?}", identity.id),
                ));
            }
            match (&identity.token, &identity.token_env) {
                (Some(_), Some(_)) => {
                    return Err(ConfigError::invalid(
                        key("token"),
                        "set either token or token_env, not both",
                    ))
                }
                (None, None) => {
                    return Err(ConfigError::invalid(
                        key("token"),
                        "one of token or token_env is required",
                    ))
                }
                (Some(t), None) if t.len() < 8 => {
                    return Err(ConfigError::invalid(
                        key("token"),
                        "must be at least 8 characters",
                    ))
                }
                _ => {}
            }
            for (j, domain) in identity.allow_domains.iter().enumerate() {
                if let Err(message) = crate::domain::validate_pattern(domain) {
                    return Err(ConfigError::invalid(
                        key(&format!("allow_domains[{j}]")),
                        message,
                    ));
                }
            }
        }
        for (i, token) in self.api.tokens.iter().enumerate() {
            let key = |field: &str| format!("api.tokens[{i}].{field}");
            match (&token.token, &token.token_env) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(ConfigError::invalid(
                        key("token"),
                        "set exactly one of token or token_env",
                    ))
                }
                (Some(t), None) if t.len() < 16 => {
                    return Err(ConfigError::invalid(
                        key("token"),
                        "must be at least 16 characters",
                    ))
                }
                _ => {}
            }
            if token.principal.is_empty() || token.workspace.is_empty() {
                return Err(ConfigError::invalid(
                    key("principal"),
                    "principal and workspace must be non-empty",
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, credential) in self.credentials.iter().enumerate() {
            credential.validate().map_err(|(field, message)| {
                ConfigError::invalid(format!("credentials[{i}].{field}"), message)
            })?;
            if !names.insert((credential.workspace.as_str(), credential.name.as_str())) {
                return Err(ConfigError::invalid(
                    format!("credentials[{i}].name"),
                    format!(
                        "duplicate credential {:?} in workspace {:?}",
                        credential.name, credential.workspace
                    ),
                ));
            }
        }
        self.validate_routing()?;
        for (name, _) in self.dns.hosts.iter() {
            if name.is_empty() || name.contains(['/', ':', ' ']) {
                return Err(ConfigError::invalid(
                    format!("dns.hosts.{name}"),
                    "not a host name",
                ));
            }
        }
        Ok(())
    }
}

/// The kind of a provider with a hosted adapter, and everything that adapter does.
fn adapter_ceiling(
    provider: &sandgate_router::ProviderConfig,
) -> Option<(
    sandgate_router::ProviderKind,
    crate::providers::RuntimeCapabilities,
)> {
    let kind = provider
        .kind
        .or_else(|| sandgate_router::ProviderKind::from_name(&provider.name))?;
    Some((kind, crate::providers::hosted::ceiling(kind)?))
}

/// The provider with every feature its adapter cannot deliver declared off (unless the file
/// turned it on, which [`Config::validate_adapter_ceilings`] refuses): the router then
/// never routes to a pool for what its adapter lacks, whatever the kind's table says of the
/// provider itself.
fn fit_to_adapter(
    mut provider: sandgate_router::ProviderConfig,
) -> sandgate_router::ProviderConfig {
    let Some((_, ceiling)) = adapter_ceiling(&provider) else {
        return provider;
    };
    let features = provider
        .capabilities
        .get_or_insert_with(Default::default)
        .features
        .get_or_insert_with(Default::default);
    for (path, can) in ceiling.flags() {
        if let Some(slot) = features.slot(path).filter(|v| v.is_none() && !can) {
            *slot = Some(false);
        }
    }
    provider
}

impl Config {
    /// The router's part of the file.
    /// With no providers, accounts or pools configured, one local pool (`local`).
    pub fn router_config(&self) -> sandgate_router::RouterConfig {
        if self.uses_default_topology() {
            return sandgate_router::RouterConfig {
                providers: vec![sandgate_router::ProviderConfig {
                    name: "local".into(),
                    kind: Some(sandgate_router::ProviderKind::Local),
                    capabilities: None,
                }],
                accounts: vec![sandgate_router::AccountConfig::new("local", "local")],
                pools: vec![sandgate_router::PoolConfig {
                    name: "local".into(),
                    provider: "local".into(),
                    account: "local".into(),
                    geography: None,
                    region: None,
                    zone: None,
                    isolation: None,
                    resources: Default::default(),
                    sources: None,
                    features: None,
                    labels: BTreeMap::new(),
                    vpc: None,
                    price: None,
                    capacity: Some(self.local.capacity),
                    egress: None,
                    standby: false,
                }],
            };
        }
        let mut pools = self.pools.clone();
        // A hosted pool whose adapter locks its sandboxes to the gateway enforces egress
        // through it, once the gateway has an address those sandboxes can reach; one whose
        // adapter cannot (Blaxel) is advisory.
        if self.proxy.public_url.is_some() {
            for pool in pools.iter_mut().filter(|p| p.egress.is_none()) {
                let Some(provider) = self.providers.iter().find(|p| p.name == pool.provider) else {
                    continue;
                };
                let declared = provider.capabilities.as_ref().and_then(|c| c.egress);
                let kind = provider
                    .kind
                    .or_else(|| sandgate_router::ProviderKind::from_name(&provider.name));
                let Some(kind) = kind.filter(|_| declared.is_none()) else {
                    continue;
                };
                if crate::providers::hosted::locks_to_gateway(kind) {
                    pool.egress = Some(sandgate_router::EgressEnforcement::Gateway);
                } else if crate::providers::hosted::has_adapter(kind) {
                    // The proxy variables and the CA, which the sandbox may ignore.
                    pool.egress = Some(sandgate_router::EgressEnforcement::Advisory);
                }
            }
        }
        sandgate_router::RouterConfig {
            providers: self.providers.iter().cloned().map(fit_to_adapter).collect(),
            accounts: self.accounts.clone(),
            pools,
        }
    }

    /// A hosted provider may declare less than its adapter does, never more: each feature
    /// `[providers.capabilities.features]` turns on that the adapter cannot deliver is an
    /// error naming its key.
    fn validate_adapter_ceilings(&self) -> Result<(), ConfigError> {
        for (i, provider) in self.providers.iter().enumerate() {
            let Some((kind, ceiling)) = adapter_ceiling(provider) else {
                continue;
            };
            let Some(mut features) = provider
                .capabilities
                .as_ref()
                .and_then(|c| c.features.clone())
            else {
                continue;
            };
            for (path, can) in ceiling.flags() {
                if !can && features.slot(path).is_some_and(|v| *v == Some(true)) {
                    return Err(ConfigError::invalid(
                        format!("providers[{i}].capabilities.{path}"),
                        format!(
                            "provider {}: the {kind} adapter does not do this; a provider may \
                             narrow what its adapter does, never widen it",
                            provider.name
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A hosted pool's egress enforcement must be what its adapter does: `gateway` needs
    /// `[proxy] public_url` (the address its sandboxes are given) and an adapter that locks
    /// its sandboxes to it, and no adapter enforces domain lists natively.
    fn validate_hosted(&self, topology: &sandgate_router::Topology) -> Result<(), ConfigError> {
        for (i, pool) in topology.pools().iter().enumerate() {
            let kind = topology.providers()[pool.provider].kind;
            if !crate::providers::hosted::has_adapter(kind) {
                continue;
            }
            let key = format!("pools[{i}].egress");
            match pool.capabilities.egress {
                sandgate_router::EgressEnforcement::Gateway if self.proxy.public_url.is_none() => {
                    return Err(ConfigError::invalid(
                        key,
                        format!("pool {}: egress through the gateway needs [proxy] public_url, the proxy address its hosted sandboxes reach", pool.name),
                    ))
                }
                sandgate_router::EgressEnforcement::Gateway
                    if !crate::providers::hosted::locks_to_gateway(kind) =>
                {
                    return Err(ConfigError::invalid(
                        key,
                        format!("pool {}: the {} adapter cannot make the gateway a sandbox's only destination, so its pools are \"advisory\" (the proxy variables and the CA only)", pool.name, kind.as_str()),
                    ))
                }
                sandgate_router::EgressEnforcement::Gateway => {
                    if let Some(url) = self.proxy.public_url() {
                        let host = url.host.trim_start_matches('[').trim_end_matches(']');
                        crate::providers::hosted::can_lock_to(kind, &url.scheme, host, url.port)
                            .map_err(|why| {
                                ConfigError::invalid(
                                    key,
                                    format!("pool {}: {why}; or set egress = \"advisory\"", pool.name),
                                )
                            })?;
                    }
                }
                sandgate_router::EgressEnforcement::Native => {
                    return Err(ConfigError::invalid(
                        key,
                        format!("pool {}: the {} adapter locks sandboxes to the gateway (\"gateway\") or only gives them the proxy variables (\"advisory\"); it does not enforce egress natively", pool.name, kind.as_str()),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether the topology is the embedded default (no `[[providers]]`, `[[accounts]]` or
    /// `[[pools]]` in the file).
    pub fn uses_default_topology(&self) -> bool {
        self.providers.is_empty() && self.accounts.is_empty() && self.pools.is_empty()
    }

    fn validate_routing(&self) -> Result<(), ConfigError> {
        self.validate_adapter_ceilings()?;
        let topology = self.router_config().compile().map_err(|errors| {
            let first = errors.0.first().map(|e| e.path.clone()).unwrap_or_default();
            let message = errors
                .0
                .iter()
                .map(|e| format!("{}: {}", e.path, e.message))
                .collect::<Vec<_>>()
                .join("; ");
            ConfigError::invalid(first, message)
        })?;
        for (pool, sim) in &self.simulated {
            let key = format!("simulated.{pool}");
            let Some(p) = topology.pool(pool) else {
                return Err(ConfigError::invalid(key, "no pool of this name"));
            };
            if topology.providers()[p.provider].kind != sandgate_router::ProviderKind::Simulated {
                return Err(ConfigError::invalid(
                    key,
                    "the pool's provider is not of kind \"simulated\"",
                ));
            }
            sim.validate().map_err(|(field, message)| {
                ConfigError::invalid(format!("{key}.{field}"), message)
            })?;
        }
        self.validate_hosted(&topology)?;
        if self.local.proxy_port == 0 {
            return Err(ConfigError::invalid("local.proxy_port", "must not be 0"));
        }
        if self.local.capacity == 0 {
            return Err(ConfigError::invalid("local.capacity", "must be at least 1"));
        }
        self.local
            .check_users()
            .map_err(|(key, why)| ConfigError::invalid(key, why))?;
        let (defaults, max) = self.local.limits();
        if let Some(why) = defaults.exceeds(&max) {
            return Err(ConfigError::invalid("local.defaults", &why));
        }
        if self.local.dir == self.local.snapshot_dir {
            return Err(ConfigError::invalid(
                "local.snapshot_dir",
                "must differ from local.dir (whatever local.dir holds that cannot be re-adopted is removed)",
            ));
        }
        let c = &self.create;
        for (workspace, order) in &c.workspace_order {
            for (i, name) in order.iter().enumerate() {
                if name != "standby" && topology.provider(name).is_none() {
                    return Err(ConfigError::invalid(
                        format!("create.workspace_order.{workspace}[{i}]"),
                        format!("no provider {name:?} in [[providers]]"),
                    ));
                }
            }
        }
        if c.lease_ttl_ms < 100 {
            return Err(ConfigError::invalid(
                "create.lease_ttl_ms",
                "must be at least 100",
            ));
        }
        if c.janitor_interval_ms == 0 {
            return Err(ConfigError::invalid(
                "create.janitor_interval_ms",
                "must be at least 1",
            ));
        }
        if c.retry_backoff_max_ms < c.retry_backoff_ms {
            return Err(ConfigError::invalid(
                "create.retry_backoff_max_ms",
                "must be at least create.retry_backoff_ms",
            ));
        }
        if c.abandoned_check_max_secs == 0 {
            return Err(ConfigError::invalid(
                "create.abandoned_check_max_secs",
                "must be at least 1",
            ));
        }
        if !(c.startup_latency_band_ms >= 0.0 && c.creation_success_band >= 0.0) {
            return Err(ConfigError::invalid(
                "create.startup_latency_band_ms",
                "band widths must be >= 0",
            ));
        }
        Ok(())
    }
}

fn unknown_field_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest.split('`').next()?.to_string())
}

/// The dotted path of an unknown key, named once: the path reported is sometimes its
/// parent's (add the key) and sometimes already the key's own (keep it).
fn unknown_key_path(path: &str, field: &str) -> String {
    if path == "." || path.is_empty() {
        return field.to_string();
    }
    if path == field || path.ends_with(&format!(".{field}")) {
        return path.to_string();
    }
    format!("{path}.{field}")
}

/// serde's "unknown field `x`, expected one of `a`, `b`" with the closest known key
/// suggested first: "unknown field `x`, did you mean `a`? expected one of ...".
fn with_suggestion(field: &str, message: &str) -> String {
    let known: Vec<&str> = message.split('`').skip(3).step_by(2).collect();
    let Some(best) = closest(field, &known) else {
        return message.to_string();
    };
    let rest = message
        .split_once(", ")
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    format!("unknown field `{field}`, did you mean `{best}`? {rest}")
}

/// The known key nearest to `field` by edit distance, also comparing their `_`-separated
/// words in sorted order (so `lisen_tls` finds `tls_listen`); none when nothing is close.
fn closest<'a>(field: &str, known: &[&'a str]) -> Option<&'a str> {
    let words = |s: &str| {
        let mut w: Vec<&str> = s.split('_').collect();
        w.sort_unstable();
        w.join("_")
    };
    let distance = |k: &str| {
        strsim::damerau_levenshtein(field, k)
            .min(strsim::damerau_levenshtein(&words(field), &words(k)))
    };
    let (best, d) = known
        .iter()
        .map(|k| (*k, distance(k)))
        .min_by_key(|(_, d)| *d)?;
    (d <= (field.chars().count() / 3).max(1)).then_some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ports_domain_is_two_or_more_lower_case_labels() {
        assert_eq!(ports_domain_problem("sandgate.localhost"), None);
        assert_eq!(ports_domain_problem("p.example.com"), None);
        for bad in [
            "localhost",
            "",
            "a..b",
            "A.b",
            "-a.b",
            "a_b.c",
            "a.b.",
            &"a.".repeat(150),
        ] {
            assert!(ports_domain_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn empty_file_is_the_embedded_defaults() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.proxy.listen.to_string(), "127.0.0.1:3128");
        assert_eq!(c.api.listen.to_string(), "127.0.0.1:7070");
        assert_eq!(c.tls.ca_dir, PathBuf::from("certs"));
        assert_eq!(c.policy.dir, PathBuf::from("policies"));
    }

    #[test]
    fn the_documented_example_config_is_valid() {
        let text = include_str!("../deploy/sandgate.example.toml");
        let c = Config::from_toml(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.egress.identities[0].id, "ci-runner-1");
    }

    #[test]
    fn local_on_shutdown_is_keep_or_stop() {
        use crate::providers::local::OnShutdown;
        assert_eq!(
            Config::from_toml("").unwrap().local.on_shutdown,
            OnShutdown::Keep
        );
        let stop = Config::from_toml("[local]\non_shutdown = \"stop\"\n").unwrap();
        assert_eq!(stop.local.on_shutdown, OnShutdown::Stop);
        let err = Config::from_toml("[local]\non_shutdown = \"pause\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("on_shutdown") || err.contains("keep"), "{err}");
    }

    #[test]
    fn a_prime_gateway_pool_needs_an_address_prime_can_allow() {
        let topology = |url: &str| {
            format!(
                "[proxy]\npublic_url = \"{url}\"\n\
                 [[providers]]\nname = \"prime-intellect\"\n\
                 [[accounts]]\nname = \"pi\"\nprovider = \"prime-intellect\"\n\
                 api_key_env = \"SANDGATE_TEST_UNSET_PI_KEY\"\n\
                 [[pools]]\nname = \"p\"\nprovider = \"prime-intellect\"\naccount = \"pi\"\n"
            )
        };
        for ok in [
            "https://203.0.113.7:3129",
            "https://gw.example.com:443",
            "http://203.0.113.7:3128",
        ] {
            Config::from_toml(&topology(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "https://gw.example.com:3129",
            "http://gw.example.com:443",
            "https://[2001:db8::1]:3129",
        ] {
            let err = Config::from_toml(&topology(bad)).unwrap_err().to_string();
            assert!(
                err.contains("pools[0].egress") && err.contains("advisory"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_blaxel_pool_is_advisory_never_gateway() {
        let topology = |egress: &str| {
            format!(
                "[proxy]\npublic_url = \"http://gw.example:3128\"\n\
                 [[providers]]\nname = \"blaxel\"\n\
                 [[accounts]]\nname = \"bl\"\nprovider = \"blaxel\"\n\
                 api_key_env = \"SANDGATE_TEST_UNSET_BL_KEY\"\n\
                 options = {{ workspace = \"w\" }}\n\
                 [[pools]]\nname = \"p\"\nprovider = \"blaxel\"\naccount = \"bl\"\n{egress}"
            )
        };
        let c = Config::from_toml(&topology("")).unwrap_or_else(|e| panic!("{e}"));
        let router = c.router_config();
        assert_eq!(
            router.pools[0].egress,
            Some(sandgate_router::EgressEnforcement::Advisory)
        );
        let err = Config::from_toml(&topology("egress = \"gateway\"\n")).unwrap_err();
        assert!(err.to_string().contains("advisory"), "{err}");
        assert!(Config::from_toml(&topology("egress = \"advisory\"\n")).is_ok());
    }

    #[test]
    fn unknown_key_is_named_with_its_path() {
        let err = Config::from_toml("[proxy]\nlistn = \"127.0.0.1:1\"\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("proxy.listn"), "{text}");
        assert!(text.contains("did you mean `listen`?"), "{text}");
    }

    /// The key path is named once (it was `proxy.lisen_tls.lisen_tls`), and a swap of its
    /// words is still recognised; a key near nothing gets no suggestion.
    #[test]
    fn an_unknown_key_is_named_once_with_the_nearest_known_one() {
        let text = Config::from_toml("[proxy]\nlisen_tls = \"127.0.0.1:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(text.starts_with("config key `proxy.lisen_tls`: unknown field `lisen_tls`, did you mean `tls_listen`? expected one of `listen`"), "{text}");
        let text = Config::from_toml("janitor = 1\n").unwrap_err().to_string();
        assert!(
            text.starts_with("config key `janitor`: unknown field `janitor`, expected"),
            "{text}"
        );
        let text = Config::from_toml("[create]\njanitor_intervl_ms = 5\n")
            .unwrap_err()
            .to_string();
        assert!(text.contains("`create.janitor_intervl_ms`: unknown field `janitor_intervl_ms`, did you mean `janitor_interval_ms`?"), "{text}");
    }

    #[test]
    fn routing_errors_name_the_key() {
        let base = "[[providers]]\nname = \"sim\"\nkind = \"simulated\"\n[[accounts]]\nname = \"a\"\nprovider = \"sim\"\n";
        let err = Config::from_toml(&format!(
            "{base}[[pools]]\nname = \"p\"\nprovider = \"sim\"\naccount = \"nope\"\n"
        ))
        .unwrap_err();
        assert!(err.to_string().contains("`pools[0].account`"), "{err}");
        let ok = format!("{base}[[pools]]\nname = \"p\"\nprovider = \"sim\"\naccount = \"a\"\n");
        let c = Config::from_toml(&format!("{ok}[simulated.p]\ncapacity = 2\n")).unwrap();
        assert_eq!(c.simulated["p"].capacity, 2);
        let err = Config::from_toml(&format!("{ok}[simulated.q]\n")).unwrap_err();
        assert!(err.to_string().contains("simulated.q"), "{err}");
        let err =
            Config::from_toml(&format!("{ok}[simulated.p]\nscript = [\"boom\"]\n")).unwrap_err();
        assert!(err.to_string().contains("simulated.p.script[0]"), "{err}");
        let err = Config::from_toml("[create]\nshort_wait = 1\n").unwrap_err();
        assert!(err.to_string().contains("create.short_wait"), "{err}");
    }

    #[test]
    fn one_identity_s_tunnels_stay_below_the_connection_cap() {
        let proxy = |toml: &str| Config::from_toml(&format!("[proxy]\n{toml}")).map(|c| c.proxy);
        // Derived from max_connections: a quarter, at most 256, at least 1.
        assert_eq!(proxy("").unwrap().tunnels_per_identity(), 256);
        assert_eq!(
            proxy("max_connections = 100")
                .unwrap()
                .tunnels_per_identity(),
            25
        );
        assert_eq!(
            proxy("max_connections = 2").unwrap().tunnels_per_identity(),
            1
        );
        assert_eq!(
            proxy("max_connections = 100\nmax_tunnels_per_identity = 99")
                .unwrap()
                .tunnels_per_identity(),
            99
        );
        for bad in [
            "max_connections = 100\nmax_tunnels_per_identity = 100",
            "max_connections = 100\nmax_tunnels_per_identity = 256",
            "max_tunnels_per_identity = 0",
        ] {
            let err = proxy(bad).unwrap_err().to_string();
            assert!(
                err.contains("proxy.max_tunnels_per_identity"),
                "{bad}: {err}"
            );
        }
        let err = proxy("max_connections = 100\nmax_tunnels_per_identity = 100")
            .unwrap_err()
            .to_string();
        assert!(err.contains("below proxy.max_connections (100)"), "{err}");
    }

    #[test]
    fn e2b_allow_out_lists_are_checked_where_they_are_set() {
        let ok =
            "[e2b]\nallow_out = [\"pypi.org\", \"*.pythonhosted.org\", \"10.0.0.0/8\", \"::1\"]\n\
                  [e2b.templates.offline]\nallow_out = []\n";
        Config::from_toml(ok).unwrap();
        for (toml, key) in [
            ("[e2b]\nallow_out = [\"a b\"]\n", "e2b.allow_out"),
            (
                "[e2b.templates.t]\nallow_out = [\"https://x.test/\"]\n",
                "e2b.templates.t.allow_out",
            ),
            (
                "[[e2b.api_keys]]\nkey_env = \"K\"\nprincipal = \"p\"\nworkspace = \"w\"\nallow_out = [\"\"]\n",
                "e2b.api_keys[0].allow_out",
            ),
        ] {
            let err = Config::from_toml(toml).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn invalid_value_is_named_with_its_path() {
        let err = Config::from_toml("[egress]\nallow_private = [\"10.0.0.0/33\"]\n").unwrap_err();
        assert!(err.to_string().contains("egress.allow_private"), "{err}");
        let err = Config::from_toml(
            "[[egress.identities]]\nid = \"a\"\ntoken = \"abcdefgh\"\nworkspace = \"w\"\nallow_domains = [\"a.*.com\"]\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("egress.identities[0].allow_domains[0]"),
            "{err}"
        );
        let err = Config::from_toml("[proxy]\nworkers = 5000\n").unwrap_err();
        assert!(err.to_string().contains("proxy.workers"), "{err}");
        assert_eq!(
            Config::from_toml("[proxy]\nworkers = 3\n")
                .unwrap()
                .proxy
                .workers,
            3
        );
    }

    #[test]
    fn store_url_selects_postgres_and_never_shows_its_password() {
        let c =
            Config::from_toml("[store]\nurl = \"postgres://app:pw-s3cret@db:5432/sg\"\n").unwrap();
        let url = c.store.url.as_ref().unwrap();
        assert_eq!(url.expose(), "postgres://app:pw-s3cret@db:5432/sg");
        // The SQLite keys keep their defaults (the local token file still lives in data/).
        assert_eq!(c.store.path, PathBuf::from("data/sandgate.db"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("pw-s3cret"), "{shown}");
        assert!(shown.contains("postgres://app:***@db:5432/sg"), "{shown}");
        assert!(Config::from_toml("").unwrap().store.url.is_none());
    }

    #[test]
    fn store_url_and_path_together_are_refused_naming_both() {
        for (key, line) in [
            ("store.path", "path = \"data/x.db\""),
            ("store.synchronous", "synchronous = \"normal\""),
        ] {
            let err = Config::from_toml(&format!(
                "[store]\nurl = \"postgres://app:pw-s3cret@db/sg\"\n{line}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("store.url") && err.contains(key), "{err}");
            assert!(!err.contains("pw-s3cret"), "{err}");
        }
        // Either alone is fine.
        assert!(Config::from_toml("[store]\npath = \"x.db\"\nsynchronous = \"normal\"\n").is_ok());
    }

    /// One hosted provider named `kind` with an account and a pool, plus `extra` lines in
    /// its `[providers.capabilities.features]`.
    fn one_hosted(kind: &str, features: &str) -> String {
        format!(
            "[[providers]]\nname = \"{kind}\"\n\
             [providers.capabilities.features]\n{features}\n\
             [[accounts]]\nname = \"acct\"\nprovider = \"{kind}\"\n\
             api_key_env = \"SANDGATE_TEST_UNSET_KEY\"\n\
             [[pools]]\nname = \"pool\"\nprovider = \"{kind}\"\naccount = \"acct\"\n"
        )
    }

    #[test]
    fn a_provider_never_declares_more_than_its_adapter_does() {
        for (kind, line, key) in [
            ("modal", "process = { cancel = true }", "process.cancel"),
            ("blaxel", "public_ports = true", "public_ports"),
            ("prime-intellect", "pause_resume = true", "pause_resume"),
            (
                "cloudflare",
                "filesystem = { list = true }",
                "filesystem.list",
            ),
        ] {
            let err = Config::from_toml(&one_hosted(kind, line))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("providers[0].capabilities.features.{key}"))
                    && err.contains(&format!("the {kind} adapter does not do this")),
                "{err}"
            );
        }
        // Narrowing is fine, and so is declaring what the adapter does.
        Config::from_toml(&one_hosted("e2b", "pause_resume = false")).unwrap();
        Config::from_toml(&one_hosted("daytona", "pause_resume = true")).unwrap();
    }

    #[test]
    fn declared_capabilities_are_narrowed_to_the_adapter() {
        let features = |kind: &str| {
            let c = Config::from_toml(&one_hosted(kind, "")).unwrap();
            let topology = c.router_config().compile().unwrap();
            topology.pools()[0].capabilities.clone()
        };
        // The kind's table says Blaxel publishes ports; its adapter does not.
        assert!(
            sandgate_router::ProviderKind::Blaxel
                .builtin_capabilities()
                .public_ports
        );
        assert!(!features("blaxel").public_ports);
        let modal = features("modal");
        assert!(modal.process.execute && modal.process.ordered_output && !modal.process.cancel);
        assert!(features("e2b").pause_resume);
        // What the file does not mention is the adapter's, never more: every kind with an
        // adapter, every feature.
        for kind in sandgate_router::ProviderKind::ALL {
            let Some(ceiling) = crate::providers::hosted::ceiling(kind) else {
                continue;
            };
            let declared = features(kind.as_str());
            for ((path, on), (_, can)) in declared.feature_flags().into_iter().zip(ceiling.flags())
            {
                assert!(!on || can, "{kind}: {path} declared beyond its adapter");
            }
        }
    }

    #[test]
    fn store_url_of_another_scheme_is_refused() {
        for url in [
            "sqlite://data/x.db",
            "mysql://u:pw-s3cret@h/db",
            "not a url",
        ] {
            let err = Config::from_toml(&format!("[store]\nurl = {url:?}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("store.url"), "{err}");
            assert!(!err.contains("pw-s3cret"), "{err}");
        }
        let err = Config::from_toml("[store]\npaht = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("store.paht"), "{err}");
    }
}

#[cfg(test)]
#[path = "config_keys_tests.rs"]
mod keys_tests;
