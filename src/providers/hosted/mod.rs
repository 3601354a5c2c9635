//! Hosted providers: the adapters (E2B, Daytona, Vercel, Runloop, Prime Intellect, Blaxel,
//! Cloudflare through its bridge Worker, Modal over gRPC, Northflank, Freestyle, CodeSandbox's
//! lifecycle), the layer they share, and building one adapter per
//! `[[accounts]]` entry.
//!
//! Contract:
//! - One adapter per account, shared by every pool on it (they share its HTTP connections
//!   and its rate limits). Kinds without an adapter build nothing: their pools advance as
//!   `unsupported`; an account naming no key gets no adapter (`unbound_account`).
//! - The shared layer, below the adapters (they import it; it imports none of them):
//!   [`account`] (key, base URL, option checks), [`http`] (authenticated calls, retries,
//!   redaction), [`errors`] (the failure table each adapter declares, applied by one
//!   function), [`poll`] (waiting for a provider-side state), [`tags`] (the tags a create
//!   carries, reconciliation's tag listing, client-made ids), [`shell`] (an argv as one
//!   quoted shell line), [`lockdown`] (the gateway as a native allow entry and the CA step). An adapter module holds only what is provider specific: its
//!   wire types, paths, bodies and tables.
//! - A new adapter is a directory here, an arm in [`build`] and [`has_adapter`].

pub mod account;
pub mod errors;
pub mod http;
pub mod lockdown;
pub mod poll;
pub mod shell;
pub mod tags;

pub mod blaxel;
pub mod cloudflare;
pub mod codesandbox;
pub mod daytona;
pub mod e2b;
pub mod freestyle;
pub mod modal;
pub mod northflank;
pub mod prime;
pub mod runloop;
pub mod vercel;

use std::collections::BTreeMap;
use std::sync::Arc;

use sandgate_router::{AccountConfig, ProviderKind};

pub use account::{api_key, AccountError};

use account::{check_base_url, OptionError};
use blaxel::{Blaxel, BlaxelAccount};
use cloudflare::{Cloudflare, CloudflareAccount};
use codesandbox::{Codesandbox, CodesandboxAccount};
use daytona::{Daytona, DaytonaAccount};
use e2b::{E2b, E2bAccount};
use freestyle::{Freestyle, FreestyleAccount};
use modal::{Modal, ModalAccount};
use northflank::{Northflank, NorthflankAccount};
use prime::{Prime, PrimeAccount};
use runloop::{Runloop, RunloopAccount};
use vercel::{Vercel, VercelAccount};

use crate::credentials::Secret;
use crate::providers::{Provider, RuntimeCapabilities};

/// Whether this build has an adapter for `kind` on hosted accounts.
pub fn has_adapter(kind: ProviderKind) -> bool {
    matches!(
        kind,
        ProviderKind::E2b
            | ProviderKind::Daytona
            | ProviderKind::Vercel
            | ProviderKind::Runloop
            | ProviderKind::PrimeIntellect
            | ProviderKind::Blaxel
            | ProviderKind::Cloudflare
            | ProviderKind::Modal
            | ProviderKind::Northflank
            | ProviderKind::Freestyle
            | ProviderKind::Codesandbox
    )
}

/// Everything this build's adapter for `kind` can do (`None`: no adapter). Declared
/// capabilities are narrowed to it by default, and a provider's `[providers.capabilities]`
/// that claims more is a config error: a router that promised what the adapter cannot do
/// would place sandboxes that then fail the runtime check, or worse, serve them badly.
pub fn ceiling(kind: ProviderKind) -> Option<RuntimeCapabilities> {
    Some(match kind {
        ProviderKind::E2b => e2b::CAPABILITIES,
        ProviderKind::Daytona => daytona::CAPABILITIES,
        ProviderKind::Vercel => vercel::CAPABILITIES,
        ProviderKind::Runloop => runloop::CAPABILITIES,
        ProviderKind::PrimeIntellect => prime::CAPABILITIES,
        ProviderKind::Blaxel => blaxel::CAPABILITIES,
        ProviderKind::Cloudflare => cloudflare::CAPABILITIES,
        ProviderKind::Modal => modal::CAPABILITIES,
        ProviderKind::Northflank => northflank::CAPABILITIES,
        ProviderKind::Freestyle => freestyle::CAPABILITIES,
        ProviderKind::Codesandbox => codesandbox::CAPABILITIES,
        _ => return None,
    })
}

/// Whether this build's adapter for `kind` locks a sandbox's egress to the gateway. An
/// adapter that does not (Blaxel: [`blaxel::LOCKS_DOWN`], Northflank:
/// [`northflank::LOCKS_DOWN`], Freestyle: [`freestyle::LOCKS_DOWN`]) gives its sandboxes the proxy
/// variables and the CA only: its pools are `advisory`. CodeSandbox
/// ([`codesandbox::LOCKS_DOWN`]) has no outbound controls and cannot even pass those.
pub fn locks_to_gateway(kind: ProviderKind) -> bool {
    match kind {
        ProviderKind::Blaxel => blaxel::LOCKS_DOWN,
        ProviderKind::Northflank => northflank::LOCKS_DOWN,
        ProviderKind::Freestyle => freestyle::LOCKS_DOWN,
        ProviderKind::Codesandbox => codesandbox::LOCKS_DOWN,
        _ => has_adapter(kind),
    }
}

/// Whether a `gateway` pool of `kind` can be locked to the gateway at `public_url`
/// (`scheme`, `host` without brackets, `port`), or why not: checked when the config loads,
/// so a lock-down the provider cannot express is a start error, not a failure of every
/// create. Kinds whose every address works answer `Ok`.
pub fn can_lock_to(kind: ProviderKind, scheme: &str, host: &str, port: u16) -> Result<(), String> {
    match kind {
        ProviderKind::PrimeIntellect => {
            let egress = crate::providers::RemoteEgress {
                proxy_url: format!("{scheme}://{host}:{port}"),
                gateway_host: host.to_string(),
                gateway_port: port,
                ca_pem: String::new(),
                lock_down: true,
            };
            prime::allow_entry(&egress).map(|_| ())
        }
        _ => Ok(()),
    }
}

/// The adapter for one account, or `None` when this build has none for its kind.
pub fn build(
    kind: ProviderKind,
    account: &AccountConfig,
    tls: &rustls::ClientConfig,
) -> Result<Option<Arc<dyn Provider>>, AccountError> {
    // An account naming no key cannot serve; its pools' attempts advance as
    // `unbound_account` (the coordinator checks), which is not a reason to refuse to start.
    if !has_adapter(kind) || !account.has_credential() {
        return Ok(None);
    }
    let key = api_key(account)?;
    if let Some(url) = account.base_url.as_deref() {
        check_base_url(url).map_err(|m| AccountError::new(account, "base_url", m))?;
    }
    let adapter = match kind {
        ProviderKind::E2b => adapter(account, key, tls, E2bAccount::from_options, E2b::new)?,
        ProviderKind::Daytona => adapter(
            account,
            key,
            tls,
            DaytonaAccount::from_options,
            Daytona::new,
        )?,
        ProviderKind::Vercel => {
            adapter(account, key, tls, VercelAccount::from_options, Vercel::new)?
        }
        ProviderKind::Runloop => adapter(
            account,
            key,
            tls,
            RunloopAccount::from_options,
            Runloop::new,
        )?,
        ProviderKind::PrimeIntellect => {
            adapter(account, key, tls, PrimeAccount::from_options, Prime::new)?
        }
        ProviderKind::Blaxel => {
            adapter(account, key, tls, BlaxelAccount::from_options, Blaxel::new)?
        }
        ProviderKind::Cloudflare => adapter(
            account,
            key,
            tls,
            CloudflareAccount::from_options,
            Cloudflare::new,
        )?,
        ProviderKind::Modal => adapter(account, key, tls, ModalAccount::from_options, Modal::new)?,
        ProviderKind::Northflank => adapter(
            account,
            key,
            tls,
            NorthflankAccount::from_options,
            Northflank::new,
        )?,
        ProviderKind::Freestyle => adapter(
            account,
            key,
            tls,
            FreestyleAccount::from_options,
            Freestyle::new,
        )?,
        ProviderKind::Codesandbox => adapter(
            account,
            key,
            tls,
            CodesandboxAccount::from_options,
            Codesandbox::new,
        )?,
        _ => return Ok(None),
    };
    Ok(Some(adapter))
}

type FromOptions<S> = fn(Option<&str>, &BTreeMap<String, String>, Secret) -> Result<S, OptionError>;

/// One adapter from its account settings (`options` checked) and its constructor.
fn adapter<S, P: Provider + 'static>(
    account: &AccountConfig,
    key: Secret,
    tls: &rustls::ClientConfig,
    settings: FromOptions<S>,
    new: fn(S, rustls::ClientConfig) -> Result<P, String>,
) -> Result<Arc<dyn Provider>, AccountError> {
    let settings = settings(account.base_url.as_deref(), &account.options, key)
        .map_err(|(field, m)| AccountError::new(account, &field, m))?;
    let adapter =
        new(settings, tls.clone()).map_err(|m| AccountError::new(account, "base_url", m))?;
    Ok(Arc::new(adapter))
}
