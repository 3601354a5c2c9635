//! Workspace-scoped credentials, applied outside the sandbox.
//!
//! Contract:
//! - A credential belongs to a workspace (optionally one user in it), has a name, a secret,
//!   the destinations where it may be used (`{host, ports, methods, path_prefix}`; host exact
//!   or `*.suffix`), and how it is applied: a header from a template (`Bearer {secret}`),
//!   HTTP basic auth, or a query parameter.
//! - Secrets are sealed (AES-256-GCM under the master key) before they reach the database
//!   and are held in memory only as [`Secret`]. No response, log line, decision record or
//!   error message contains one. Rotation replaces the secret and leaves bindings alone.
//! - A sandbox binds credentials by name; only its own workspace's (and user's) can be bound.
//! - Per request inside an intercepted tunnel: every bound credential whose destinations
//!   match is authorized by the `sandgate.credential` policy layer with destination context
//!   and then applied (replacing what the sandbox sent in that place); a refusal refuses the
//!   request (403 `credential_denied`), it is never forwarded without the credential.
//! - Placeholders (`sgph_…`, one per sandbox and credential) are accepted only in their
//!   credential's declared slot (see [`apply`]); anywhere else, in any encoding the scanner
//!   knows ([`scan`]), they refuse the request (403 `credential_destination_mismatch`): a
//!   placeholder never reaches an upstream, and a secret is never written outside its slot.
//! - Responses to a request that carried a secret are scrubbed of it ([`scrub`]).
//! - Deleting or replacing a credential retires the version in memory at once: a request that
//!   applied it and has not been forwarded yet is refused instead.

pub mod apply;
pub mod aws;
pub mod aws_chunked;
pub mod github;
pub mod keys;
mod mint;
pub mod notes;
pub mod oauth2;
pub use crate::base::scan;
pub mod scrub;
pub mod seal;
pub mod secret;
pub mod tokens;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

pub use seal::MasterKey;
pub use secret::Secret;

use crate::store::Store;

/// Where a credential may be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DestinationRule {
    /// Exact host or `*.suffix`.
    pub host: String,
    /// Allowed ports; empty means 443 only.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Allowed methods (upper case); empty means any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Path prefix the request path must start with; empty means any.
    #[serde(default)]
    pub path_prefix: Option<String>,
}

impl DestinationRule {
    /// Host and port only (any method, any path).
    pub fn covers(&self, host: &str, port: u16) -> bool {
        let port_ok = if self.ports.is_empty() {
            port == 443
        } else {
            self.ports.contains(&port)
        };
        port_ok && crate::domain::matches(&self.host, host)
    }

    /// `path` is the normalised path without the query.
    pub fn matches(&self, host: &str, port: u16, method: &str, path: &str) -> bool {
        self.covers(host, port)
            && (self.methods.is_empty()
                || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method)))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| path.starts_with(prefix))
    }
}

/// How the secret is put on a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Apply {
    /// `name: template` with `{secret}` replaced, e.g. `Authorization: Bearer {secret}`.
    Header { name: String, template: String },
    /// `Authorization: Basic base64(username:secret)`.
    Basic { username: String },
    /// `?param=secret` (replacing any value the sandbox sent for it).
    Query { param: String },
    /// Re-sign AWS Signature Version 4 requests: the sandbox's SDK signs with its placeholder
    /// key; a request whose `Authorization` names that placeholder as its access key id is
    /// signed again with the real key for `service` and `region` (see [`aws`]). The secret is
    /// the JSON document `{"access_key_id", "secret_access_key", "session_token"?}`.
    AwsSigv4 {
        service: String,
        region: String,
        /// An S3-compatible endpoint's host name (R2, MinIO…): `<bucket>.<endpoint>` is read
        /// as virtual-hosted, `<endpoint>` as path-style. Without it only AWS's own names tell
        /// the bucket (see [`aws::operation_at`]). Not serialized when unset, so the stored
        /// metadata of credentials without one (and their declaration digests) stay as they were.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<String>,
    },
    /// An OAuth2 access token sandgate obtains from `token_url` and injects as
    /// `Authorization: Bearer` (see [`oauth2`]). The secret is the client secret
    /// (`client_credentials`), the refresh token (`refresh_token`, public client), or the
    /// JSON document `{"client_secret"?, "refresh_token"?}`.
    Oauth2 {
        grant: oauth2::Grant,
        token_url: String,
        client_id: String,
        #[serde(default)]
        scopes: Vec<String>,
        /// How the client authenticates at the token endpoint (default HTTP Basic).
        #[serde(default)]
        client_auth: oauth2::ClientAuth,
    },
    /// A GitHub App installation token (see [`github`]): `Authorization: Bearer` for the
    /// API, `Basic x-access-token:<token>` for git over HTTPS. The secret is the App's
    /// private key (PEM).
    GithubApp {
        app_id: u64,
        installation_id: u64,
        /// The REST API base the installation token is minted at.
        #[serde(default = "github::default_api_url")]
        api_url: String,
    },
}

impl Apply {
    /// The `type` tag, for the API, the decision log and policy input.
    pub fn kind(&self) -> &'static str {
        match self {
            Apply::Header { .. } => "header",
            Apply::Basic { .. } => "basic",
            Apply::Query { .. } => "query",
            Apply::AwsSigv4 { .. } => "aws_sigv4",
            Apply::Oauth2 { .. } => "oauth2",
            Apply::GithubApp { .. } => "github_app",
        }
    }
}

/// Everything about a credential except its secret: what the API returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = CredentialMetadata)]
pub struct CredentialMeta {
    pub workspace: String,
    #[serde(default)]
    pub user: Option<String>,
    pub name: String,
    pub destinations: Vec<DestinationRule>,
    pub apply: Apply,
    /// Environment variable a sandbox receives its placeholder in (e.g. `GITHUB_TOKEN`).
    #[serde(default)]
    pub placeholder_env: Option<String>,
    /// Also remove the secret from response bodies (text content types, streamed; see
    /// `credentials::scrub`). Response headers and trailers are always scrubbed.
    #[serde(default)]
    pub scrub_response_body: bool,
}

impl CredentialMeta {
    /// Checks the fields; errors are `(field, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |field: &str, message: String| Err((field.to_string(), message));
        if !valid_name(&self.name) {
            return bad(
                "name",
                "use 1-64 of a-z, 0-9, '-', '_', '.', starting with a letter or digit".into(),
            );
        }
        if self.workspace.is_empty() {
            return bad("workspace", "must not be empty".into());
        }
        if self.destinations.is_empty() {
            return bad(
                "destinations",
                "at least one destination is required".into(),
            );
        }
        for (i, d) in self.destinations.iter().enumerate() {
            crate::domain::validate_pattern(&d.host)
                .or_else(|m| bad(&format!("destinations[{i}].host"), m))?;
            if let Some(prefix) = &d.path_prefix {
                if !prefix.starts_with('/') {
                    return bad(
                        &format!("destinations[{i}].path_prefix"),
                        "must start with '/'".into(),
                    );
                }
            }
        }
        match &self.apply {
            Apply::Header { name, template } => {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return bad("apply.name", format!("{name:?} is not a header name"));
                }
                if !template.contains("{secret}") {
                    return bad("apply.template", "must contain {secret}".into());
                }
            }
            Apply::Basic { username } => {
                if username.contains(':') {
                    return bad("apply.username", "must not contain ':'".into());
                }
            }
            Apply::Query { param } => {
                if param.is_empty() || param.contains(['&', '=', '#']) {
                    return bad("apply.param", "not a query parameter name".into());
                }
            }
            Apply::AwsSigv4 {
                service,
                region,
                endpoint,
            } => {
                for (field, value) in [("apply.service", service), ("apply.region", region)] {
                    if !aws::is_scope_name(value) {
                        return bad(field, "use 1-64 of a-z, 0-9 and '-'".into());
                    }
                }
                if let Some(endpoint) = endpoint {
                    if !aws::is_endpoint_name(endpoint) {
                        return bad(
                            "apply.endpoint",
                            "a lower-case host name (no scheme, port or path)".into(),
                        );
                    }
                }
            }
            Apply::Oauth2 {
                token_url,
                client_id,
                scopes,
                ..
            } => oauth2::validate(token_url, client_id, scopes).or_else(|(f, m)| bad(f, m))?,
            Apply::GithubApp { api_url, .. } => {
                github::validate(api_url).or_else(|(f, m)| bad(f, m))?
            }
        }
        if let Some(env) = &self.placeholder_env {
            if env.is_empty()
                || !env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                || env.starts_with(|c: char| c.is_ascii_digit())
            {
                return bad(
                    "placeholder_env",
                    format!("{env:?} is not an environment variable name"),
                );
            }
        }
        Ok(())
    }

    /// The environment a sandbox bound to this credential gets: `placeholder_env` holding
    /// the placeholder, and for `aws_sigv4` the variables every AWS SDK reads, the key id and
    /// the secret both being the placeholder (the SDK signs with them; the proxy signs again
    /// with the real key, and they open nothing anywhere else).
    pub fn placeholder_vars(&self, placeholder: &str) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        if let Apply::AwsSigv4 { region, .. } = &self.apply {
            vars.push(("AWS_ACCESS_KEY_ID".to_string(), placeholder.to_string()));
            vars.push(("AWS_SECRET_ACCESS_KEY".to_string(), placeholder.to_string()));
            vars.push(("AWS_REGION".to_string(), region.clone()));
        }
        if let Some(var) = &self.placeholder_env {
            vars.push((var.clone(), placeholder.to_string()));
        }
        vars
    }

    pub(crate) fn seal_context(&self) -> String {
        format!("credential\n{}\n{}", self.workspace, self.name)
    }
}

/// 1-64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or digit: a name is used in
/// URL paths and file-like places, so `.`, `..` and `.hidden` must not be names.
fn valid_name(name: &str) -> bool {
    name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
}

/// A credential as declared in the config file: the secret comes from `secret_env` or
/// `secret_file`, never inline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub workspace: String,
    #[serde(default)]
    pub user: Option<String>,
    pub name: String,
    pub destinations: Vec<DestinationRule>,
    pub apply: Apply,
    #[serde(default)]
    pub placeholder_env: Option<String>,
    #[serde(default)]
    pub scrub_response_body: bool,
    /// Environment variable holding the secret.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// File holding the secret (trailing newline removed).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
}

impl CredentialConfig {
    pub fn meta(&self) -> CredentialMeta {
        CredentialMeta {
            workspace: self.workspace.clone(),
            user: self.user.clone(),
            name: self.name.clone(),
            destinations: self.destinations.clone(),
            apply: self.apply.clone(),
            placeholder_env: self.placeholder_env.clone(),
            scrub_response_body: self.scrub_response_body,
        }
    }

    pub fn validate(&self) -> Result<(), (String, String)> {
        self.meta().validate()?;
        match (&self.secret_env, &self.secret_file) {
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => Err((
                "secret_env".into(),
                "set exactly one of secret_env or secret_file (secrets are never inline)".into(),
            )),
        }
    }

    pub fn read_secret(&self) -> Result<Secret, CredentialError> {
        let missing = |reason: String| CredentialError::SecretSource {
            name: self.name.clone(),
            reason,
        };
        if let Some(var) = &self.secret_env {
            let value = std::env::var(var)
                .map_err(|_| missing(format!("environment variable {var} is not set")))?;
            return Ok(Secret::new(value));
        }
        if let Some(path) = &self.secret_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| missing(format!("{}: {e}", path.display())))?;
            return Ok(Secret::new(text.trim_end_matches(['\r', '\n'])));
        }
        Err(missing("no secret source".into()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("credential {name:?}: {reason}")]
    SecretSource { name: String, reason: String },
    #[error("invalid credential field `{field}`: {message}")]
    Invalid { field: String, message: String },
    #[error("credential {name:?} already exists in workspace {workspace:?}")]
    Exists { workspace: String, name: String },
    #[error("no credential {name:?} in workspace {workspace:?}")]
    NotFound { workspace: String, name: String },
    #[error(transparent)]
    Seal(#[from] seal::SealError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// A credential ready to apply.
#[derive(Debug)]
pub struct Credential {
    pub meta: CredentialMeta,
    pub secret: Secret,
    /// Bumped on every change, so callers can tell a rotation happened.
    pub version: i64,
    /// `input.credential` for the credential policy layer, built once.
    pub policy_value: regorus::Value,
    /// Every form of the secret, to scrub responses with.
    pub scrubber: Arc<scrub::Scrubber>,
    /// The secret as this credential's type uses it.
    pub material: Material,
    /// Set when this version is deleted or replaced.
    retired: AtomicBool,
}

/// The secret as a credential's type uses it.
pub enum Material {
    /// `header`, `basic`, `query`: the secret itself goes into the slot.
    Static,
    /// `aws_sigv4`: the keys requests are signed with.
    Aws(aws::AwsKeys),
    /// `oauth2`, `github_app`: tokens minted from the secret.
    Tokens(Arc<tokens::TokenSource>),
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Material::Static => "Static",
            Material::Aws(_) => "Aws",
            Material::Tokens(_) => "Tokens",
        })
    }
}

/// The shortest AWS access key id responses are scrubbed of (see [`Parsed::scrubbed`]).
const MIN_SCRUBBED_KEY_ID: usize = 8;

/// A secret read as its type needs it, before anything is minted.
enum Parsed {
    Static,
    Aws(aws::AwsKeys),
    /// The client, and the refresh token it starts from.
    Oauth2(oauth2::Client, Option<Secret>),
    GithubApp(github::App),
}

/// Reads `secret` as `apply` needs it; the message names the problem, never the secret.
fn parse_secret(apply: &Apply, secret: &Secret) -> Result<Parsed, String> {
    Ok(match apply {
        Apply::Header { .. } | Apply::Basic { .. } | Apply::Query { .. } => Parsed::Static,
        Apply::AwsSigv4 { .. } => {
            Parsed::Aws(aws::AwsKeys::parse(secret).map_err(|e| e.to_string())?)
        }
        Apply::Oauth2 {
            grant,
            token_url,
            client_id,
            scopes,
            client_auth,
        } => {
            let secrets = oauth2::ClientSecrets::parse(*grant, secret)?;
            let client = oauth2::Client {
                grant: *grant,
                token_url: token_url.clone(),
                client_id: client_id.clone(),
                client_secret: secrets.client_secret,
                scopes: scopes.clone(),
                client_auth: *client_auth,
            };
            Parsed::Oauth2(client, secrets.refresh_token)
        }
        Apply::GithubApp {
            app_id,
            installation_id,
            api_url,
        } => Parsed::GithubApp(github::App::new(
            *app_id,
            *installation_id,
            api_url,
            secret,
        )?),
    })
}

impl Parsed {
    /// What responses are scrubbed of: the values that travel on the wire, and for AWS the
    /// whole key. The access key id is no secret to AWS but it is to the sandbox: it names
    /// the real identity, and S3 echoes it in error bodies (`<AWSAccessKeyId>` of
    /// `InvalidAccessKeyId` and `SignatureDoesNotMatch`).
    fn scrubbed<'a>(&'a self, secret: &'a Secret) -> Vec<&'a str> {
        match self {
            Parsed::Aws(keys) => {
                let mut values = vec![keys.secret_access_key.expose()];
                values.extend(keys.session_token.as_ref().map(Secret::expose));
                // An id of a few characters would match ordinary text in every answer (and
                // headers are always scrubbed); AWS's are 20, S3-compatible ones rarely short.
                if keys.access_key_id.len() >= MIN_SCRUBBED_KEY_ID {
                    values.push(&keys.access_key_id);
                }
                values
            }
            Parsed::Oauth2(client, refresh_token) => vec![client
                .client_secret
                .as_ref()
                .or(refresh_token.as_ref())
                .unwrap_or(secret)
                .expose()],
            Parsed::Static | Parsed::GithubApp(_) => vec![secret.expose()],
        }
    }
}

/// A credential as `GET /v1/workspaces/{ws}/credentials/{name}` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CredentialView {
    #[serde(flatten)]
    pub meta: CredentialMeta,
    pub version: i64,
    /// How the secret is applied: the `apply.type`.
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// A minted credential's (oauth2, github_app) token status; never the token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<tokens::Status>,
}

impl Credential {
    /// What the API shows: the metadata, the version, the `type` and, for a minted
    /// credential, the current token's expiry and the last refresh (never a token).
    pub fn view(&self) -> CredentialView {
        CredentialView {
            meta: self.meta.clone(),
            version: self.version,
            kind: self.meta.apply.kind(),
            token: match &self.material {
                Material::Tokens(source) => Some(source.status()),
                _ => None,
            },
        }
    }

    /// Whether this version was deleted or replaced since it was read.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }
}

/// The credential set: sealed in the store, open in memory for the request path.
pub struct CredentialStore {
    key: Arc<MasterKey>,
    store: Store,
    minting: Arc<tokens::Minting>,
    by_name: RwLock<HashMap<(String, String), Arc<Credential>>>,
    /// Serialises writes (database row and cache entry together), so the cache can never
    /// end up holding what the database does not: writes are rare, reads never wait on it.
    writes: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialStore").finish_non_exhaustive()
    }
}

/// Identities bind credentials through this (see `identity::CredentialDirectory`).
impl crate::identity::CredentialDirectory for CredentialStore {
    fn owner(&self, workspace: &str, name: &str) -> Option<Option<String>> {
        self.get(workspace, name).map(|c| c.meta.user.clone())
    }

    fn placeholder(&self, sandbox: &str, workspace: &str, name: &str) -> String {
        self.key.placeholder(sandbox, workspace, name)
    }
}

impl CredentialStore {
    /// Loads every stored credential, then writes the ones declared in config whose
    /// declaration (metadata or secret) changed since it was last written, or that the store
    /// lacks (see [`CredentialStore::declare`]): editing the file and restarting rotates them,
    /// restarting with the same file changes nothing.
    pub async fn load(
        key: Arc<MasterKey>,
        store: Store,
        declared: &[CredentialConfig],
    ) -> Result<CredentialStore, CredentialError> {
        let credentials = CredentialStore {
            minting: Arc::new(tokens::Minting::new(store.clone(), key.clone())),
            key,
            store,
            by_name: RwLock::new(HashMap::new()),
            writes: tokio::sync::Mutex::new(()),
        };
        for row in credentials.store.list_credentials().await? {
            credentials.sync_row(&row)?;
        }
        for declared in declared {
            let secret = declared.read_secret()?;
            credentials.declare(declared.meta(), secret).await?;
        }
        Ok(credentials)
    }

    /// Writes a credential the config file declares, unless the store holds what this very
    /// declaration wrote. Rewriting it on every start would bump its version, and state kept
    /// under the version (an OAuth2 refresh token the endpoint rotated) would be dropped for the
    /// spent token in the file: a restart or a rolling deploy would end the credential. What
    /// was written is remembered as digests of the declaration (metadata and secret) and of
    /// the secret alone, sealed in `store_secrets` so they say nothing about a weak secret to
    /// whoever reads the database. A credential replaced through the API keeps the API's version
    /// until the file changes. When only what surrounds the secret changed (destinations,
    /// scopes…), the file's secret is the one written before, so a refresh token rotated from
    /// it since is newer than the file's: it moves to the new version.
    async fn declare(&self, meta: CredentialMeta, secret: Secret) -> Result<(), CredentialError> {
        let record = declaration_record_name(&meta.workspace, &meta.name);
        let declared = Declared::of(&meta, &secret);
        let current = self.get(&meta.workspace, &meta.name);
        let recorded = self.recorded_declaration(&record).await?;
        if current.is_some() && recorded.as_ref() == Some(&declared) {
            tracing::debug!(
                workspace = %meta.workspace, credential = %meta.name,
                "declared credential unchanged since it was written; the stored version is kept"
            );
            return Ok(());
        }
        let carried_from = match (&current, &recorded) {
            (Some(current), Some(recorded)) if recorded.secret == declared.secret => {
                Some(current.version)
            }
            _ => None,
        };
        let (workspace, name) = (meta.workspace.clone(), meta.name.clone());
        self.put(meta, Some(secret), true).await?;
        if let (Some(from), Some(written)) = (carried_from, self.get(&workspace, &name)) {
            self.minting
                .carry_rotated(&workspace, &name, from, written.version)
                .await;
        }
        let context = keys::store_secret_context(&record);
        let sealed = self.key.seal(&Secret::new(declared.text()), &context)?;
        self.store.put_store_secret(&record, &sealed).await?;
        tracing::info!(
            workspace = %workspace, credential = %name,
            "declared credential written (new or changed in the config)"
        );
        Ok(())
    }

    /// What the last write of a declared credential recorded; `None` when there is nothing,
    /// or nothing that opens and reads (either way the declaration is written again).
    async fn recorded_declaration(
        &self,
        record: &str,
    ) -> Result<Option<Declared>, CredentialError> {
        let Some(sealed) = self.store.store_secret(record).await? else {
            return Ok(None);
        };
        let context = keys::store_secret_context(record);
        Ok(self
            .key
            .open(&sealed, &context)
            .ok()
            .and_then(|text| Declared::parse(text.expose())))
    }

    pub fn key(&self) -> &MasterKey {
        &self.key
    }

    /// The HTTP client token endpoints (OAuth2, GitHub) are reached with; without one,
    /// minted credentials answer 503 `credential_unavailable`.
    pub fn enable_minting(&self, http: reqwest::Client) {
        self.minting.set_http(http);
    }

    /// Brings one cached credential in line with the store, after another replica wrote
    /// it (see `crate::propagation`): replaced (the old one retired, so streams using it end)
    /// when the stored row differs, dropped when the row is gone. Returns whether the cache
    /// changed. Serialised with this replica's own writes, so it reads the newest row.
    pub async fn refresh(&self, workspace: &str, name: &str) -> Result<bool, CredentialError> {
        let _write = self.writes.lock().await;
        match self.store.get_credential(workspace, name).await? {
            Some(row) => self.sync_row(&row),
            None => Ok(self.forget(workspace, name)),
        }
    }

    /// The whole cache against the store (the followers' safety net for changes they did
    /// not hear of). Returns how many entries it had to repair.
    pub async fn reconcile(&self) -> Result<usize, CredentialError> {
        let _write = self.writes.lock().await;
        let rows = self.store.list_credentials().await?;
        let mut repaired = 0;
        for row in &rows {
            repaired += usize::from(self.sync_row(row)?);
        }
        let stored: std::collections::HashSet<(&str, &str)> = rows
            .iter()
            .map(|r| (r.workspace.as_str(), r.name.as_str()))
            .collect();
        let cached: Vec<(String, String)> = self
            .by_name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .filter(|(w, n)| !stored.contains(&(w.as_str(), n.as_str())))
            .cloned()
            .collect();
        for (workspace, name) in cached {
            repaired += usize::from(self.forget(&workspace, &name));
        }
        Ok(repaired)
    }

    /// Caches a stored row unless the cache holds exactly it already; returns whether it
    /// changed the cache. A row whose version went down (deleted and created again) still
    /// replaces: the store is the truth.
    fn sync_row(&self, row: &crate::store::CredentialRow) -> Result<bool, CredentialError> {
        let meta: CredentialMeta =
            serde_json::from_str(&row.meta_json).map_err(|e| CredentialError::Invalid {
                field: format!("stored credential {}/{}", row.workspace, row.name),
                message: e.to_string(),
            })?;
        let secret = self.key.open(&row.sealed, &meta.seal_context())?;
        if let Some(current) = self.get(&meta.workspace, &meta.name) {
            if current.version == row.version
                && current.meta == meta
                && current.secret.expose() == secret.expose()
            {
                return Ok(false);
            }
        }
        self.cache(meta, secret, row.version, true)?;
        Ok(true)
    }

    /// Drops a cached credential (retiring it); whether there was one.
    fn forget(&self, workspace: &str, name: &str) -> bool {
        let removed = self
            .by_name
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(workspace.to_string(), name.to_string()));
        match removed {
            Some(old) => {
                old.retire();
                true
            }
            None => false,
        }
    }

    fn insert_cached(
        &self,
        meta: CredentialMeta,
        secret: Secret,
        version: i64,
    ) -> Result<(), CredentialError> {
        self.cache(meta, secret, version, false)
    }

    /// `force`: replace whatever version is cached (the row was read from the store under
    /// the write lock); otherwise an entry never goes backwards.
    fn cache(
        &self,
        meta: CredentialMeta,
        secret: Secret,
        version: i64,
        force: bool,
    ) -> Result<(), CredentialError> {
        let key = (meta.workspace.clone(), meta.name.clone());
        let policy_value = regorus::Value::from(serde_json::json!({
            "name": meta.name, "workspace": meta.workspace, "user": meta.user,
            "destinations": meta.destinations, "type": meta.apply.kind(),
        }));
        let parsed =
            parse_secret(&meta.apply, &secret).map_err(|message| CredentialError::Invalid {
                field: format!("stored credential {}/{} secret", meta.workspace, meta.name),
                message,
            })?;
        let username = match &meta.apply {
            Apply::Basic { username } => Some(username.as_str()),
            _ => None,
        };
        let scrubber = Arc::new(scrub::Scrubber::of(&parsed.scrubbed(&secret), username));
        let material = self.material(&meta, version, parsed);
        let credential = Arc::new(Credential {
            meta,
            secret,
            version,
            policy_value,
            scrubber,
            material,
            retired: AtomicBool::new(false),
        });
        let mut map = self.by_name.write().unwrap_or_else(|e| e.into_inner());
        if !force
            && map
                .get(&key)
                .is_some_and(|current| current.version > version)
        {
            // A newer version is cached already: an entry never goes backwards.
            return Ok(());
        }
        if let Some(old) = map.insert(key, credential) {
            old.retire();
        }
        Ok(())
    }

    fn material(&self, meta: &CredentialMeta, version: i64, parsed: Parsed) -> Material {
        let (minter, refresh_token, basic) = match parsed {
            Parsed::Static => return Material::Static,
            Parsed::Aws(keys) => return Material::Aws(keys),
            Parsed::Oauth2(client, refresh_token) => {
                (tokens::Minter::Oauth2(client), refresh_token, None)
            }
            Parsed::GithubApp(app) => (
                tokens::Minter::GithubApp(app),
                None,
                Some(github::BASIC_USERNAME),
            ),
        };
        let owner = tokens::Owner {
            workspace: meta.workspace.clone(),
            name: meta.name.clone(),
            version,
        };
        Material::Tokens(Arc::new(tokens::TokenSource::new(
            minter,
            owner,
            self.minting.clone(),
            refresh_token,
            basic,
        )))
    }

    pub fn get(&self, workspace: &str, name: &str) -> Option<Arc<Credential>> {
        self.by_name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(workspace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn list(&self, workspace: &str) -> Vec<CredentialMeta> {
        let mut out: Vec<CredentialMeta> = self
            .by_name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|c| c.meta.workspace == workspace)
            .map(|c| c.meta.clone())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Creates (`upsert` false: an existing name is an error) or replaces a credential.
    /// `secret: None` keeps the current secret (metadata-only update).
    pub async fn put(
        &self,
        meta: CredentialMeta,
        secret: Option<Secret>,
        upsert: bool,
    ) -> Result<CredentialMeta, CredentialError> {
        meta.validate()
            .map_err(|(field, message)| CredentialError::Invalid { field, message })?;
        let _write = self.writes.lock().await;
        let existing = self.get(&meta.workspace, &meta.name);
        if existing.is_some() && !upsert {
            return Err(CredentialError::Exists {
                workspace: meta.workspace,
                name: meta.name,
            });
        }
        let secret = match (secret, &existing) {
            (Some(secret), _) => secret,
            (None, Some(current)) => current.secret.clone(),
            (None, None) => {
                return Err(CredentialError::Invalid {
                    field: "secret".into(),
                    message: "a new credential needs a secret".into(),
                })
            }
        };
        if secret.is_empty() {
            return Err(CredentialError::Invalid {
                field: "secret".into(),
                message: "must not be empty".into(),
            });
        }
        parse_secret(&meta.apply, &secret).map_err(|message| CredentialError::Invalid {
            field: "secret".into(),
            message,
        })?;
        let sealed = self.key.seal(&secret, &meta.seal_context())?;
        let meta_json = serde_json::to_string(&meta).expect("credential metadata serializes");
        let version = if upsert {
            self.store
                .upsert_credential(&meta.workspace, &meta.name, &meta_json, &sealed)
                .await?
        } else {
            // An INSERT, not an upsert: if another writer (another replica) created the name
            // meanwhile, this create loses with 409 instead of replacing its secret.
            let inserted = self
                .store
                .insert_credential(&meta.workspace, &meta.name, &meta_json, &sealed)
                .await?;
            inserted.ok_or_else(|| CredentialError::Exists {
                workspace: meta.workspace.clone(),
                name: meta.name.clone(),
            })?
        };
        self.insert_cached(meta.clone(), secret, version)?;
        Ok(meta)
    }

    pub async fn delete(&self, workspace: &str, name: &str) -> Result<(), CredentialError> {
        let _write = self.writes.lock().await;
        let removed = self.store.delete_credential(workspace, name).await?;
        self.forget(workspace, name);
        // A rotated refresh token outlives nothing it belonged to.
        self.store
            .delete_store_secret(&tokens::rotated_refresh_token_name(workspace, name))
            .await?;
        // A declared credential deleted here is written again from the file at the next start
        // (its row is missing); the record of the last write goes with the row.
        self.store
            .delete_store_secret(&declaration_record_name(workspace, name))
            .await?;
        if !removed {
            return Err(CredentialError::NotFound {
                workspace: workspace.into(),
                name: name.into(),
            });
        }
        Ok(())
    }
}

/// The `store_secrets` name the digest of a declared credential's last write is kept under.
fn declaration_record_name(workspace: &str, name: &str) -> String {
    format!("config-declaration/{workspace}/{name}")
}

/// What the last write of a declared credential recorded (kept as `whole\nsecret`).
#[derive(Debug, PartialEq, Eq)]
struct Declared {
    /// SHA-256 (hex) of the declaration: its metadata as stored and its secret.
    whole: String,
    /// SHA-256 (hex) of the secret alone.
    secret: String,
}

impl Declared {
    fn of(meta: &CredentialMeta, secret: &Secret) -> Declared {
        let meta_json = serde_json::to_string(meta).expect("credential metadata serializes");
        let mut whole = ring::digest::Context::new(&ring::digest::SHA256);
        whole.update(meta_json.as_bytes());
        // The metadata is JSON, so it holds no NUL: the boundary is unambiguous.
        whole.update(b"\0");
        whole.update(secret.expose().as_bytes());
        Declared {
            whole: hex::encode(whole.finish()),
            secret: hex::encode(ring::digest::digest(
                &ring::digest::SHA256,
                secret.expose().as_bytes(),
            )),
        }
    }

    fn text(&self) -> String {
        format!("{}\n{}", self.whole, self.secret)
    }

    fn parse(text: &str) -> Option<Declared> {
        let (whole, secret) = text.split_once('\n')?;
        Some(Declared {
            whole: whole.to_string(),
            secret: secret.to_string(),
        })
    }
}
