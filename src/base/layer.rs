//! The policy layers, as a type: a caller names a layer by variant, so a misspelt layer is
//! a compile error rather than a default deny at run time.

/// One policy layer; its package is `sandgate.<name>` ([`Layer::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    Egress,
    Credential,
    Creation,
    Provider,
    Lifecycle,
    Action,
}

impl Layer {
    /// Every layer, in `policy::LAYERS`' order.
    pub const ALL: [Layer; 6] = [
        Layer::Egress,
        Layer::Credential,
        Layer::Creation,
        Layer::Provider,
        Layer::Lifecycle,
        Layer::Action,
    ];

    /// The layer's name: its package's last segment, and what decisions, logs and error
    /// details call it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Layer::Egress => "egress",
            Layer::Credential => "credential",
            Layer::Creation => "creation",
            Layer::Provider => "provider",
            Layer::Lifecycle => "lifecycle",
            Layer::Action => "action",
        }
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of the layers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown layer {0:?}; known: egress, credential, creation, provider, lifecycle, action")]
pub struct UnknownLayer(pub String);

impl std::str::FromStr for Layer {
    type Err = UnknownLayer;

    fn from_str(name: &str) -> Result<Layer, UnknownLayer> {
        Layer::ALL
            .into_iter()
            .find(|l| l.as_str() == name)
            .ok_or_else(|| UnknownLayer(name.to_string()))
    }
}
