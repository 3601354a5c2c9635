//! Short-lived tokens sandgate obtains for a credential and applies in its place: OAuth2
//! access tokens ([`super::oauth2`]) and GitHub App installation tokens ([`super::github`]).
//!
//! Contract:
//! - One [`TokenSource`] per credential version holds the current token. A request uses it
//!   while it is fresh; in the last quarter of its life (at most five minutes before expiry)
//!   a request still uses it and starts one refresh in the background; within the last
//!   tenth (at most 30 s) it is no longer used and requests wait for the refresh.
//! - Refreshes are serialised: however many requests find the token expired at once, one
//!   of them asks the token endpoint and the others wait for its answer.
//! - A failure is classified ([`MintError`]): a refused grant (`invalid_grant`, a revoked
//!   client, a bad App key) ends the credential: every request gets 403
//!   `credential_unavailable` until the credential is replaced, with no further calls to the
//!   endpoint. Server errors, timeouts and network errors are retried with exponential
//!   backoff; when the retries run out the request gets 503 `credential_unavailable` and the
//!   next request tries again.
//! - A refresh token the endpoint rotates is kept sealed in the store (`store_secrets`,
//!   under this credential's version), read again before every refresh so a replica uses the
//!   newest one (and once more after a refusal, in case another replica rotated it in
//!   between), and never leaves this module except towards the token endpoint. Replicas do
//!   not serialise their refreshes with each other: two refreshing the same rotating
//!   credential at the same instant can still lose one rotation to the endpoint.
//! - The version, and so the rotated token, survives restarts: a credential declared in the
//!   config is written again only when its declaration changed (`CredentialStore::declare`);
//!   the new version starts from the file's token when the secret changed, and keeps the
//!   rotated one ([`Minting::carry_rotated`]) when only what surrounds it did.
//! - What [`TokenSource::status`] reports (expiry, last outcome, the endpoint's error code)
//!   never includes a token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use backon::{ExponentialBuilder, Retryable};
use serde::Serialize;

pub use super::mint::{Fresh, MintError};
use super::scrub::Scrubber;
use super::{MasterKey, Secret};
use crate::store::Store;

/// A token ready to apply.
pub struct Minted {
    pub token: Secret,
    /// Every form of the token, to scrub responses with.
    pub scrubber: Arc<Scrubber>,
    pub expires_at: SystemTime,
    refresh_at: Instant,
    usable_until: Instant,
}

impl Minted {
    fn new(fresh: &Fresh, basic_username: Option<&str>) -> Minted {
        let now = Instant::now();
        let lifetime = fresh.lifetime;
        let refresh_margin = (lifetime / 4).min(Duration::from_secs(300));
        let safety = (lifetime / 10).min(Duration::from_secs(30));
        Minted {
            scrubber: Arc::new(Scrubber::new(&fresh.token, basic_username)),
            token: fresh.token.clone(),
            expires_at: SystemTime::now() + lifetime,
            refresh_at: now + (lifetime - refresh_margin),
            usable_until: now + (lifetime - safety),
        }
    }
}

/// Why a request cannot have a token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// The credential ended (its grant was refused); replace it to use it again.
    #[error("the token endpoint refused this credential's grant ({0}); replace the credential to use it again")]
    Ended(String),
    /// No token now; a later request tries again.
    #[error("no token could be obtained: {0}")]
    Unavailable(String),
}

/// What the API shows about a credential's token (never the token).
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
#[schema(as = TokenStatus)]
pub struct Status {
    /// When the current token expires (RFC 3339).
    pub expires_at: Option<String>,
    /// When the last refresh finished, its outcome (`ok`, `rejected`, `transient_error`) and,
    /// for a failure, why.
    pub last_refresh_at: Option<String>,
    #[schema(value_type = Option<String>)]
    pub last_refresh_outcome: Option<&'static str>,
    pub last_refresh_error: Option<String>,
    /// Whether the credential ended (its grant was refused).
    pub ended: bool,
    pub refreshes: u64,
}

/// Who mints the token.
pub enum Minter {
    Oauth2(super::oauth2::Client),
    GithubApp(super::github::App),
}

impl Minter {
    async fn mint(
        &self,
        http: &reqwest::Client,
        refresh_token: Option<&Secret>,
    ) -> Result<Fresh, MintError> {
        match self {
            Minter::Oauth2(client) => client.mint(http, refresh_token).await,
            Minter::GithubApp(app) => app.mint(http).await,
        }
    }

    fn uses_refresh_token(&self) -> bool {
        matches!(self, Minter::Oauth2(c) if c.uses_refresh_token())
    }
}

/// What every token source shares: the HTTP client token endpoints are reached with (set
/// once the gateway's resolver exists) and where rotated refresh tokens are kept.
pub struct Minting {
    http: OnceLock<reqwest::Client>,
    store: Store,
    key: Arc<MasterKey>,
}

impl Minting {
    pub fn new(store: Store, key: Arc<MasterKey>) -> Minting {
        Minting {
            http: OnceLock::new(),
            store,
            key,
        }
    }

    /// The client token endpoints are reached with; only the first call has an effect.
    pub fn set_http(&self, http: reqwest::Client) {
        let _ = self.http.set(http);
    }

    /// Moves the rotated refresh token kept for version `from` of a credential (if that is
    /// the version it was kept for) to version `to`: the credential was written again from
    /// the same refresh token, which the kept one has superseded. A failure is logged, and the
    /// new version starts from the written token.
    pub(super) async fn carry_rotated(&self, workspace: &str, name: &str, from: i64, to: i64) {
        let store_name = rotated_refresh_token_name(workspace, name);
        let context = super::keys::store_secret_context(&store_name);
        let Ok(Some(sealed)) = self.store.store_secret(&store_name).await else {
            return;
        };
        let Ok(opened) = self.key.open(&sealed, &context) else {
            return;
        };
        let Some((version, token)) = opened.expose().split_once('\n') else {
            return;
        };
        if version != from.to_string() || token.is_empty() {
            return;
        }
        let value = Secret::new(format!("{to}\n{token}"));
        let written = match self.key.seal(&value, &context) {
            Ok(sealed) => self
                .store
                .put_store_secret(&store_name, &sealed)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match written {
            Ok(()) => tracing::info!(
                workspace,
                credential = name,
                from,
                to,
                "the rotated refresh token moves to the credential's new version"
            ),
            Err(error) => tracing::warn!(
                workspace, credential = name, %error,
                "cannot move the rotated refresh token to the new version; it starts from the declared one"
            ),
        }
    }
}

/// Which credential version a source belongs to (where its rotated refresh token lives).
pub struct Owner {
    pub workspace: String,
    pub name: String,
    pub version: i64,
}

impl Owner {
    fn store_name(&self) -> String {
        rotated_refresh_token_name(&self.workspace, &self.name)
    }
}

enum State {
    Empty,
    Ready(Arc<Minted>),
    Ended(String),
}

/// The current token of one credential version.
pub struct TokenSource {
    minter: Minter,
    owner: Owner,
    minting: Arc<Minting>,
    /// The refresh token in use (the configured one, or the newest rotated one).
    refresh_token: Mutex<Option<Secret>>,
    /// `Basic` username the token is written with (its scrubber covers that form).
    basic_username: Option<&'static str>,
    state: RwLock<State>,
    refreshing: tokio::sync::Mutex<()>,
    background: AtomicBool,
    status: Mutex<Status>,
}

impl TokenSource {
    pub fn new(
        minter: Minter,
        owner: Owner,
        minting: Arc<Minting>,
        refresh_token: Option<Secret>,
        basic_username: Option<&'static str>,
    ) -> TokenSource {
        TokenSource {
            minter,
            owner,
            minting,
            refresh_token: Mutex::new(refresh_token),
            basic_username,
            state: RwLock::new(State::Empty),
            refreshing: tokio::sync::Mutex::new(()),
            background: AtomicBool::new(false),
            status: Mutex::new(Status::default()),
        }
    }

    /// A token to apply now (see the module documentation for when this waits).
    pub async fn token(self: &Arc<Self>) -> Result<Arc<Minted>, TokenError> {
        let now = Instant::now();
        match &*self.state.read().unwrap_or_else(|e| e.into_inner()) {
            State::Ready(m) if now < m.refresh_at => return Ok(m.clone()),
            State::Ready(m) if now < m.usable_until => {
                self.refresh_in_background();
                return Ok(m.clone());
            }
            State::Ended(why) => return Err(TokenError::Ended(why.clone())),
            _ => {}
        }
        self.refresh(|m| Instant::now() < m.usable_until).await
    }

    pub fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn refresh_in_background(self: &Arc<Self>) {
        if self.background.swap(true, Ordering::SeqCst) {
            return;
        }
        let source = self.clone();
        tokio::spawn(async move {
            // A token refreshed meanwhile (by a waiting request) is left alone.
            let _ = source.refresh(|m| Instant::now() < m.refresh_at).await;
            source.background.store(false, Ordering::SeqCst);
        });
    }

    /// One refresh at a time: a caller that waited for another's refresh uses its token
    /// when `good_enough` says so, instead of asking again.
    async fn refresh(
        &self,
        good_enough: impl Fn(&Minted) -> bool,
    ) -> Result<Arc<Minted>, TokenError> {
        let _one = self.refreshing.lock().await;
        match &*self.state.read().unwrap_or_else(|e| e.into_inner()) {
            State::Ready(m) if good_enough(m) => return Ok(m.clone()),
            State::Ended(why) => return Err(TokenError::Ended(why.clone())),
            _ => {}
        }
        let result = self.mint_with_retries().await;
        if let Ok(Fresh {
            rotated_refresh_token: Some(rotated),
            ..
        }) = &result
        {
            self.keep_rotated(rotated.clone()).await;
        }
        self.settle(result)
    }

    async fn mint_with_retries(&self) -> Result<Fresh, MintError> {
        let Some(http) = self.minting.http.get() else {
            return Err(MintError::Transient(
                "this gateway reaches no token endpoints (minting is not set up)".into(),
            ));
        };
        if !self.minter.uses_refresh_token() {
            return self.mint_retrying_transient(http).await;
        }
        self.load_rotated().await;
        let used = self.current_refresh_token();
        let result = self.mint_retrying_transient(http).await;
        if !matches!(result, Err(MintError::Rejected(_))) {
            return result;
        }
        // Another replica may have rotated the refresh token between our read of the store
        // and our request: if the store holds a newer one now, that one gets a chance.
        self.load_rotated().await;
        let newer = self.current_refresh_token();
        if newer.as_ref().map(Secret::expose) == used.as_ref().map(Secret::expose) {
            return result;
        }
        self.mint_retrying_transient(http).await
    }

    /// One mint, retried with backoff while it fails transiently.
    async fn mint_retrying_transient(&self, http: &reqwest::Client) -> Result<Fresh, MintError> {
        let attempt = || async {
            let refresh_token = self.current_refresh_token();
            self.minter.mint(http, refresh_token.as_ref()).await
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(3)
            .with_jitter();
        attempt
            .retry(backoff)
            .when(|e| matches!(e, MintError::Transient(_)))
            .notify(|e, _| {
                metrics::counter!("sandgate_credential_refresh_total", "outcome" => e.outcome())
                    .increment(1);
                tracing::warn!(
                    workspace = %self.owner.workspace, credential = %self.owner.name,
                    error = %e, "token refresh failed; retrying"
                );
            })
            .await
    }

    /// Records what a refresh came to and hands out its token.
    fn settle(&self, result: Result<Fresh, MintError>) -> Result<Arc<Minted>, TokenError> {
        let outcome = result.as_ref().map_or_else(|e| e.outcome(), |_| "ok");
        metrics::counter!("sandgate_credential_refresh_total", "outcome" => outcome).increment(1);
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        status.last_refresh_at = Some(crate::base::clock::rfc3339(SystemTime::now()));
        status.last_refresh_outcome = Some(outcome);
        status.refreshes += 1;
        match result {
            Ok(fresh) => {
                let minted = Arc::new(Minted::new(&fresh, self.basic_username));
                status.expires_at = Some(crate::base::clock::rfc3339(minted.expires_at));
                status.last_refresh_error = None;
                *self.state.write().unwrap_or_else(|e| e.into_inner()) =
                    State::Ready(minted.clone());
                Ok(minted)
            }
            Err(MintError::Rejected(why)) => {
                tracing::warn!(
                    workspace = %self.owner.workspace, credential = %self.owner.name,
                    error = %why, "the token endpoint refused the grant; the credential ended"
                );
                status.last_refresh_error = Some(why.clone());
                status.ended = true;
                *self.state.write().unwrap_or_else(|e| e.into_inner()) = State::Ended(why.clone());
                Err(TokenError::Ended(why))
            }
            Err(MintError::Transient(why)) => {
                status.last_refresh_error = Some(why.clone());
                Err(TokenError::Unavailable(why))
            }
        }
    }

    fn current_refresh_token(&self) -> Option<Secret> {
        self.refresh_token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Uses the rotated refresh token in the store, if one was kept for this version.
    async fn load_rotated(&self) {
        let name = self.owner.store_name();
        let Ok(Some(sealed)) = self.minting.store.store_secret(&name).await else {
            return;
        };
        let context = super::keys::store_secret_context(&name);
        let Ok(opened) = self.minting.key.open(&sealed, &context) else {
            return;
        };
        if let Some((version, token)) = opened.expose().split_once('\n') {
            if version == self.owner.version.to_string() && !token.is_empty() {
                *self.refresh_token.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Secret::new(token));
            }
        }
    }

    /// Uses `rotated` from now on and keeps it sealed in the store, before anyone refreshes
    /// again (the next refresh reads the store first).
    async fn keep_rotated(&self, rotated: Secret) {
        *self.refresh_token.lock().unwrap_or_else(|e| e.into_inner()) = Some(rotated.clone());
        let name = self.owner.store_name();
        let value = Secret::new(format!("{}\n{}", self.owner.version, rotated.expose()));
        let context = super::keys::store_secret_context(&name);
        let written = match self.minting.key.seal(&value, &context) {
            Ok(sealed) => self
                .minting
                .store
                .put_store_secret(&name, &sealed)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = written {
            tracing::warn!(
                workspace = %self.owner.workspace, credential = %self.owner.name, %error,
                "cannot keep the rotated refresh token; it is used from memory until restart"
            );
        }
    }
}

/// The store name a credential's rotated refresh token is kept under (deleted with it).
pub fn rotated_refresh_token_name(workspace: &str, name: &str) -> String {
    format!("oauth2-refresh-token/{workspace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// When a token stops being fresh and stops being used, from its lifetime: the last
    /// quarter (at most 5 minutes) is the background-refresh window, the last tenth (at
    /// most 30 s) is not used at all.
    #[test]
    fn refresh_and_use_windows_follow_the_lifetime() {
        let windows = |secs: u64| {
            let before = Instant::now();
            let fresh = Fresh {
                token: Secret::new("t"),
                lifetime: Duration::from_secs(secs),
                rotated_refresh_token: None,
            };
            let m = Minted::new(&fresh, None);
            let after = before.elapsed();
            let refresh = m.refresh_at.duration_since(before);
            let usable = m.usable_until.duration_since(before);
            (refresh, usable, after)
        };
        let close = |got: Duration, want: u64, slack: Duration| {
            let want = Duration::from_secs(want);
            got >= want && got <= want + slack
        };
        let (refresh, usable, slack) = windows(100);
        assert!(close(refresh, 75, slack), "{refresh:?}");
        assert!(close(usable, 90, slack), "{usable:?}");
        let (refresh, usable, slack) = windows(3600);
        assert!(close(refresh, 3300, slack), "{refresh:?}");
        assert!(close(usable, 3570, slack), "{usable:?}");
    }
}
