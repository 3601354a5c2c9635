//! Network safety for upstream destinations: which addresses may be dialed, and resolving
//! names exactly once so the vetted address is the dialed address.

pub mod guard;
pub mod resolve;
pub mod shed;

pub use guard::{AddressGuard, Forbidden};
pub use resolve::{ResolveError, Resolver};
