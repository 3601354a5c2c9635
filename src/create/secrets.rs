//! A create's secrets: its `env`, sealed at rest and opened for the walk; its egress token;
//! and the egress identity the proxy serves, built from them.

use std::collections::BTreeMap;

use base64::Engine as _;

use super::{internal, Coordinator, CreateBody};
use crate::credentials::Secret;
use crate::error::Error;
use crate::identity::Identity;
use crate::store::sandboxes::SandboxRow;

impl Coordinator {
    /// The body as stored: `env` sealed into `env_sealed` (its values may be secrets; the
    /// rest of the body is not).
    pub(super) fn stored_body(&self, body: &CreateBody, id: &str) -> Result<String, Error> {
        let mut stored = body.clone();
        if !stored.env.is_empty() {
            let plain =
                serde_json::to_string(&std::mem::take(&mut stored.env)).map_err(internal)?;
            let sealed = self
                .deps
                .credentials
                .key()
                .seal(&Secret::new(plain), &env_context(id))
                .map_err(internal)?;
            stored.env_sealed = Some(base64::engine::general_purpose::STANDARD.encode(sealed));
            // The names are not secret: kept readable for the sandbox's view.
            stored.env = body
                .env
                .keys()
                .map(|k| (k.clone(), String::new()))
                .collect();
        }
        serde_json::to_string(&stored).map_err(internal)
    }

    /// Unseals a stored body's `env`; `Err` says why it cannot be.
    pub(super) fn open_env(&self, body: &mut CreateBody, id: &str) -> Result<(), String> {
        let Some(sealed) = body.env_sealed.take() else {
            return Ok(());
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .map_err(|_| "the stored env is not base64".to_string())?;
        let plain = self
            .deps
            .credentials
            .key()
            .open(&bytes, &env_context(id))
            .map_err(|e| format!("the stored env cannot be unsealed: {e}"))?;
        body.env = serde_json::from_str(plain.expose())
            .map_err(|_| "the stored env is unreadable".to_string())?;
        Ok(())
    }

    /// The sandbox's environment: the create's `env`, then the placeholder variable of each
    /// bound credential that declares one (what its processes see instead of the secret;
    /// a placeholder wins over an `env` variable of the same name).
    pub(super) fn placeholder_env(
        &self,
        sandbox_id: &str,
        workspace: &str,
        body: &CreateBody,
    ) -> BTreeMap<String, String> {
        let mut env = body.env.clone();
        for name in &body.credentials {
            let Some(credential) = self.deps.credentials.get(workspace, name) else {
                continue;
            };
            let placeholder = self
                .deps
                .credentials
                .key()
                .placeholder(sandbox_id, workspace, name);
            env.extend(credential.meta.placeholder_vars(&placeholder));
        }
        env
    }

    /// Registers the sandbox's egress identity with the proxy, exactly as static identities
    /// are: its allow-list and its bound credentials.
    pub(super) async fn register_identity(&self, row: &SandboxRow) {
        if let Some(identity) = self.sandbox_identity(row) {
            self.deps.identities.register(identity);
        }
    }

    /// The egress identity of a stored sandbox: its unsealed token, allow-list, labels and
    /// bound credentials. `None` when the row cannot give one (logged).
    pub(super) fn sandbox_identity(&self, row: &SandboxRow) -> Option<Identity> {
        let Ok(body) = serde_json::from_str::<CreateBody>(&row.request_json) else {
            return None;
        };
        let token = match self
            .deps
            .credentials
            .key()
            .open(&row.token_sealed, &token_context(&row.id))
        {
            Ok(t) => t,
            Err(_) => {
                tracing::error!(sandbox = %row.id, "sandbox token cannot be unsealed; identity not registered");
                return None;
            }
        };
        let make = || {
            Identity::new(
                row.id.clone(),
                token.expose().as_bytes().to_vec(),
                row.workspace.clone(),
                body.request.network.allow_domains.clone(),
                body.request.labels.clone(),
            )
            .with_cidrs(&body.request.network.cidrs)
        };
        match make().bind(
            None,
            &body.credentials,
            self.deps.credentials.as_ref(),
            |i| format!("credentials[{i}]"),
        ) {
            Ok(identity) => Some(identity),
            Err(e) => {
                // A credential was removed since the create was accepted: run without it.
                tracing::warn!(sandbox = %row.id, error = %e, "registering without credential bindings");
                Some(make())
            }
        }
    }
}

/// The associated data a sandbox's egress token is sealed with.
fn env_context(sandbox_id: &str) -> String {
    format!("sandbox-env\n{sandbox_id}")
}

pub(crate) fn token_context(sandbox_id: &str) -> String {
    format!("sandbox-token\n{sandbox_id}")
}
