//! The `no_eligible_provider` error.

use serde::{Deserialize, Serialize};

/// Stable error code when no pool qualifies.
pub const NO_ELIGIBLE_PROVIDER: &str = "no_eligible_provider";

/// One pool that was considered and why it did not qualify.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = IneligiblePool))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub provider: String,
    pub pool: String,
    /// The request's own field paths: `features.isolation`, `network.allow_domains`, `regions`,
    /// `resources.memory_mb`, `source.image`, `routing.pool_selector.tenancy`, ...
    pub unmet_requirements: Vec<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoEligibleDetails {
    pub attempts: Vec<Attempt>,
}

/// Serializes as the inner object of the API error body: `{"code", "message", "details"}`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct NoEligible {
    pub code: String,
    pub message: String,
    pub details: NoEligibleDetails,
}

impl NoEligible {
    pub fn new(attempts: Vec<Attempt>) -> NoEligible {
        let message = if attempts.is_empty() {
            "no eligible provider: no pools are configured".to_string()
        } else {
            format!(
                "no eligible provider: none of {} pool(s) satisfies every hard requirement",
                attempts.len()
            )
        };
        NoEligible {
            code: NO_ELIGIBLE_PROVIDER.to_string(),
            message,
            details: NoEligibleDetails { attempts },
        }
    }
}
