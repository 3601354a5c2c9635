//! The policy layers, as a type: a caller names a layer by variant, so a misspelt layer is
//! a compile error rather than a default deny at run time.

/// One policy layer; its package is `sandgate.<name>` ([`Layer::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    Egress,
    Credential,
    Creation,
    Provider,
    Lifecycle,
    Action,
}

impl Layer {
    /// Every layer, in [`super::LAYERS`]' order.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layer_is_named_as_the_engine_knows_it() {
        let names: Vec<&str> = Layer::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(names, super::super::LAYERS);
    }
}
