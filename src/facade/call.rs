//! The authenticated envd call both [`super::envd`] (which authenticates it) and
//! [`super::process`] (which runs commands for it) handle. It lives apart so neither of
//! those modules imports the other for it.

use std::sync::Arc;

use crate::base::Principal;
use crate::store::sandboxes::SandboxRow;

/// An authenticated envd call: the sandbox, and the principal it runs as.
pub struct EnvdCall {
    pub row: SandboxRow,
    pub principal: Arc<Principal>,
}
