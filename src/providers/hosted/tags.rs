//! How a hosted instance carries its sandbox and attempt ids, and listing by them.
//!
//! Contract:
//! - Every create writes the two tags [`TAG_SANDBOX`] and [`TAG_ATTEMPT`] into the
//!   provider's key/value field (E2B and Runloop `metadata`, Daytona `labels`, Vercel
//!   `tags`); [`tags_of`] reads them back into [`Tags`].
//! - [`list`] is reconciliation's listing: it walks the provider's pages (the adapter's
//!   `page` fetches one from a cursor and answers its instances and the next cursor) and
//!   keeps the instances whose tags match the [`TagFilter`] — whatever the provider's own
//!   filter did, since several filter on one tag only or not at all. It stops at the last
//!   page, at a cursor that repeats, or after `max_pages`.

use std::collections::BTreeMap;
use std::future::Future;

use serde_json::{json, Value};

use crate::providers::{Instance, Tags};

pub const TAG_SANDBOX: &str = "sandgate_sandbox";
pub const TAG_ATTEMPT: &str = "sandgate_attempt";

/// A fresh canonical UUID (v4), for the ids a provider wants from its client (Prime's
/// command sessions, Modal's exec ids): some refuse any other spelling.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The tags of a create, as the provider's JSON key/value object.
pub fn tag_object(tags: &Tags) -> Value {
    json!({TAG_SANDBOX: tags.sandbox_id, TAG_ATTEMPT: tags.attempt_id})
}

/// The tags an instance carries (empty when a tag is missing).
pub fn tags_of(map: Option<&BTreeMap<String, String>>) -> Tags {
    let get = |key: &str| map.and_then(|m| m.get(key)).cloned().unwrap_or_default();
    Tags {
        sandbox_id: get(TAG_SANDBOX),
        attempt_id: get(TAG_ATTEMPT),
    }
}

/// Which instances reconciliation looks for: one sandbox's, or one attempt's.
#[derive(Debug, Clone, Copy)]
pub struct TagFilter<'a> {
    pub sandbox_id: &'a str,
    pub attempt_id: Option<&'a str>,
}

impl<'a> TagFilter<'a> {
    pub fn new(sandbox_id: &'a str, attempt_id: Option<&'a str>) -> TagFilter<'a> {
        TagFilter {
            sandbox_id,
            attempt_id,
        }
    }

    /// The tag/value pairs to ask the provider for (sandbox first).
    pub fn pairs(&self) -> Vec<(&'static str, &'a str)> {
        let mut pairs = vec![(TAG_SANDBOX, self.sandbox_id)];
        if let Some(attempt) = self.attempt_id {
            pairs.push((TAG_ATTEMPT, attempt));
        }
        pairs
    }

    /// Whether an instance's tags are the wanted ones (a missing tag never matches).
    pub fn matches(&self, tags: &Tags) -> bool {
        !tags.sandbox_id.is_empty()
            && tags.sandbox_id == self.sandbox_id
            && self
                .attempt_id
                .is_none_or(|a| !tags.attempt_id.is_empty() && tags.attempt_id == a)
    }
}

/// Every instance matching `filter`, page by page (see the module docs).
pub async fn list<E, Fut>(
    filter: TagFilter<'_>,
    max_pages: usize,
    mut page: impl FnMut(Option<String>) -> Fut,
) -> Result<Vec<Instance>, E>
where
    Fut: Future<Output = Result<(Vec<Instance>, Option<String>), E>>,
{
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..max_pages {
        let (instances, next) = page(cursor.clone()).await?;
        out.extend(instances.into_iter().filter(|i| filter.matches(&i.tags)));
        match next.filter(|n| !n.is_empty()) {
            Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
            _ => break,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::InstanceState;

    fn instance(id: &str, sandbox: &str, attempt: &str) -> Instance {
        Instance {
            id: id.into(),
            tags: Tags {
                sandbox_id: sandbox.into(),
                attempt_id: attempt.into(),
            },
            state: InstanceState::Running,
        }
    }

    #[tokio::test]
    async fn pages_are_walked_and_filtered() {
        let filter = TagFilter::new("s", Some("a1"));
        let pages = |cursor: Option<String>| async move {
            Ok::<_, ()>(match cursor.as_deref() {
                None => (
                    vec![instance("1", "s", "a1"), instance("2", "s", "a2")],
                    Some("c".to_string()),
                ),
                // A cursor that repeats ends the walk.
                _ => (
                    vec![instance("3", "s", "a1"), instance("4", "", "")],
                    Some("c".into()),
                ),
            })
        };
        let found = list(filter, 10, pages).await.unwrap();
        let ids: Vec<_> = found.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["1", "3"]);
        let map = BTreeMap::from([(TAG_SANDBOX.to_string(), "s".to_string())]);
        assert_eq!(tags_of(Some(&map)).sandbox_id, "s");
        assert!(TagFilter::new("s", None).matches(&tags_of(Some(&map))));
        assert!(!TagFilter::new("s", Some("a")).matches(&tags_of(Some(&map))));
    }
}
