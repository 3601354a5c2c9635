//! The domain pieces every layer shares, with no dependency on any of them: who is asking
//! ([`Principal`]), what time it is ([`clock`]), and fresh identifiers ([`ids`]),
//! and which policy layer decided ([`Layer`]: errors name it, below `policy`).
//!
//! Why a module of its own: the coordinator (`create`), the providers and the HTTP layer
//! (`api`) all need these, and before they lived in `api::auth` and in the simulated
//! provider, so the coordinator imported the HTTP layer and every caller of the clock
//! imported a test provider. Everything here depends only on std and small crates.

pub mod clock;
mod config_error;
pub mod ids;
mod layer;
mod principal;
pub mod scan;

pub use config_error::ConfigError;
pub use layer::Layer;
pub use principal::{DelegationScope, Principal};
