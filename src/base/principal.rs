//! Who is asking: the principal an API token (or a delegated capability) stands for.

#[derive(Debug, Clone, serde::Serialize)]
pub struct Principal {
    pub principal: String,
    pub workspace: String,
    pub roles: Vec<String>,
    /// Set when the caller is an agent holding a delegated capability of this principal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegation: Option<DelegationScope>,
}

/// What a delegated token may do.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DelegationScope {
    pub id: String,
    pub agent: String,
    pub sandbox_id: String,
    pub actions: Vec<String>,
    pub expires_ms: i64,
}

impl Principal {
    pub fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| r == "admin")
    }

    /// Whether the principal may manage resources of `workspace`: its own, or any for a
    /// platform admin.
    pub fn may_manage(&self, workspace: &str) -> bool {
        self.workspace == workspace || self.is_admin()
    }
}
