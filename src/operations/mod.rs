//! Sandbox operations, beneath every front end: what a caller may do to a placed sandbox,
//! decided and done the same way whichever front end asked (the `/v1` JSON API in `api`,
//! the E2B facade in `facade`).
//!
//! # Contract
//!
//! - **Owns**: the operations themselves, as plain async functions over [`OpsContext`], a
//!   caller ([`Principal`]), a sandbox id and typed request values: authorization
//!   ([`authorize()`]: find, policy, state, adapter), lifecycle and lifetime ([`lifecycle`]),
//!   commands ([`commands`]), interactive commands ([`interactive`]), ports ([`ports`]), files ([`files`]), snapshots ([`snapshots`]), usage
//!   ([`usage`]), deletion ([`delete`]) and delegation checks ([`delegation`]).
//! - **May import**: the layers below it: `store`, `policy`, `create` (the coordinator),
//!   `identity`, `credentials`, `providers`, `callers`, `base`, `config`, `error`.
//! - **Must not import**: `api`, `facade` or `server`; the front ends call in, never the
//!   other way. No HTTP routes, extractors or wire shapes live here: a front end parses its
//!   own request into the typed values and renders the result in its own shape.
//! - **Policy input**: built by [`crate::policy::input::operation_input`] from typed values
//!   ([`OperationDetail`], the sandbox's facts), the layer named by [`Layer`]; nothing here
//!   assembles a Rego input by hand.
//! - **Errors**: [`Error`](crate::error::Error) for now (codes and statuses are
//!   the `/v1` contract; the facade maps them to E2B's shapes).
//!
//! Every operation, in this order:
//! 1. finds the sandbox; one that does not exist and one of a workspace the caller may not
//!    manage answer the same 404, so ids of other workspaces stay private;
//! 2. asks policy: `sandgate.action` for exec and files, `sandgate.lifecycle` for `start`,
//!    `stop`, `pause`, `resume`, `snapshot`, `set_timeout`, `metrics` and `delete`; a
//!    refusal is 403 `policy_denied` with the reasons, and nothing is done;
//! 3. checks the state (else 409 `sandbox_state`);
//! 4. calls the pool's adapter; an operation the provider does not offer is 501
//!    `unsupported`.

pub mod authorize;
pub mod commands;
pub mod delegation;
pub mod delete;
pub mod files;
pub mod interactive;
pub mod lifecycle;
pub mod ports;
pub mod snapshots;
pub mod usage;

use std::sync::Arc;

use crate::callers::ApiAuth;
pub use crate::callers::Principal;
use crate::create::Coordinator;
use crate::credentials::CredentialStore;
use crate::identity::IdentityRegistry;
use crate::policy::PolicyEngine;

pub use crate::policy::Layer;
pub use authorize::{authorize, OperationDetail, ANY_STATE, LIVE};

/// What the operations work with, shared by every front end (each holds one clone).
#[derive(Clone)]
pub struct OpsContext {
    pub policy: Arc<PolicyEngine>,
    pub identities: Arc<IdentityRegistry>,
    pub credentials: Arc<CredentialStore>,
    /// The principals of `[[api.tokens]]`: a delegation's and a sandbox creator's authority
    /// is re-read from them at each use.
    pub auth: Arc<ApiAuth>,
    /// Sandbox creation and placement (coordinator, store, router topology).
    pub sandboxes: Arc<Coordinator>,
}
