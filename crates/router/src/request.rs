//! The routing-relevant part of a create request (`POST /v1/sandboxes`).
//!
//! The top level accepts unknown fields because the full create body carries more (`workspace`,
//! `credentials`, ...). Every nested object that expresses a requirement or preference is
//! `deny_unknown_fields`: a requirement the router does not understand must be rejected, not
//! silently dropped, or a sandbox could land somewhere that does not honour it.
//!
//! [`Request::validate`] holds what the types cannot say: resources are finite, positive and
//! bounded (`resources.cpu` in (0, 1024], `memory_mb` 1 to 16 TiB, `disk_gb` 1 to 64 TiB, `gpu`
//! at most 64), weights and `max_skew` are 1 to 1000, names, label keys and values carry no
//! control or invisible formatting characters ([`check_text`]) and have bounded lengths, lists
//! are bounded, and `network.cidrs` are CIDRs. Errors name the field path and never echo the
//! value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::IsolationMode;

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Request {
    /// Explicit primary provider. Only its pools skip the portable baseline.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<openapi::Name>))]
    pub provider: Option<String>,
    /// Providers to try, in order, after `provider`; candidates must be unique.
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeSet<openapi::Name>, max_items = 64))]
    pub fallback_providers: Vec<String>,
    pub source: Option<Source>,
    pub resources: Resources,
    pub features: Features,
    pub network: Network,
    /// Acceptable regions (normalized before comparison); empty means any.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<openapi::Name>, max_items = 64))]
    pub regions: Vec<String>,
    /// The new sandbox's own labels (used by self-affinity).
    #[cfg_attr(feature = "openapi", schema(value_type = openapi::Labels))]
    pub labels: BTreeMap<String, String>,
    pub routing: Routing,
}

/// Exactly one of `{"environment": ...}`, `{"image": ...}`, `{"template": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Environment(String),
    Image(String),
    Template(String),
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resources {
    /// Cores, above 0 and at most 1024 (fractions allowed).
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0, maximum = 1024))]
    pub cpu: Option<f64>,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 16777216))]
    pub memory_mb: Option<u64>,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 65536))]
    pub disk_gb: Option<u64>,
    /// Processes and threads alive at once (a pool that does not declare a limit cannot
    /// satisfy it).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4194304))]
    pub pids: Option<u64>,
    #[cfg_attr(feature = "openapi", schema(maximum = 64))]
    pub gpu: Option<u32>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<openapi::Name>))]
    pub gpu_type: Option<String>,
}

/// `Some(true)` requires a feature, `Some(false)` opts out of it (only meaningful for the portable
/// baseline), `None` leaves it to the baseline rules.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Features {
    #[cfg_attr(feature = "openapi", schema(value_type = Option<openapi::IsolationModeSchema>))]
    pub isolation: Option<IsolationMode>,
    pub process: ProcessFeatures,
    pub filesystem: FilesystemFeatures,
    pub public_ports: Option<bool>,
    pub pause_resume: Option<bool>,
    pub pty: Option<bool>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessFeatures {
    pub execute: Option<bool>,
    pub ordered_output: Option<bool>,
    pub cancel: Option<bool>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesystemFeatures {
    pub read: Option<bool>,
    pub write: Option<bool>,
    pub list: Option<bool>,
    pub delete: Option<bool>,
    pub append: Option<bool>,
    pub mkdir: Option<bool>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Network {
    /// Host names (`example.com`) or `*.suffix` patterns, or IP addresses, egress may reach.
    #[cfg_attr(
        feature = "openapi",
        schema(
            max_items = 256,
            min_length = 1,
            max_length = 253,
            pattern = r"^(?:(?:\*\.)?[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*)$"
        )
    )]
    pub allow_domains: Vec<String>,
    pub deny_all: bool,
    /// IP addresses or CIDRs (`address/prefix`) egress may reach.
    #[cfg_attr(
        feature = "openapi",
        schema(
            max_items = 256,
            pattern = r"^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}(?:/(?:0{0,2}[0-9]|0?[12][0-9]|0?3[0-2]))?|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*(?:/[0-9]{1,3})?)$"
        )
    )]
    pub cidrs: Vec<String>,
    /// A bound VPC: only pools inside it qualify.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<openapi::Name>))]
    pub vpc: Option<String>,
}

impl Network {
    /// True when the request restricts egress, which only an enforcing pool can honour.
    pub fn restricts_egress(&self) -> bool {
        !self.allow_domains.is_empty() || self.deny_all || !self.cidrs.is_empty()
    }
}

/// A ranking criterion, compared by band within a tier: `price` (configured price, lower
/// first), `startup_latency` (median measured startup latency, lower first),
/// `creation_success` (share of eligible attempts that reached running, higher first).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Configured price, lower first.
    Price,
    /// Median measured startup latency, lower first.
    StartupLatency,
    /// Share of eligible attempts that reached running, higher first.
    CreationSuccess,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Price => "price",
            Priority::StartupLatency => "startup_latency",
            Priority::CreationSuccess => "creation_success",
        }
    }
}

/// The domain a term counts sandboxes in: the pool's provider, region or zone.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopologyKey {
    Provider,
    Region,
    Zone,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operator {
    #[default]
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// A test over one pool label (or derived key such as `region`, `isolation`, `account.team`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelExpr {
    #[cfg_attr(feature = "openapi", schema(value_type = openapi::Name))]
    pub key: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = "in"))]
    pub operator: Operator,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<openapi::LabelValue>, max_items = 64))]
    pub values: Vec<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedLabelExpr {
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub weight: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = openapi::Name))]
    pub key: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = "in"))]
    pub operator: Operator,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<openapi::LabelValue>, max_items = 64))]
    pub values: Vec<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolAffinity {
    /// Every term must match.
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub required: Vec<LabelExpr>,
    /// Matching terms add their weight to the soft score.
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub preferred: Vec<WeightedLabelExpr>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxTerm {
    pub topology: TopologyKey,
    /// Existing sandboxes whose labels contain all of these match; empty matches every sandbox.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = openapi::Labels))]
    pub match_labels: BTreeMap<String, String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedSandboxTerm {
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub weight: u32,
    pub topology: TopologyKey,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = openapi::Labels))]
    pub match_labels: BTreeMap<String, String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxAffinity {
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub required: Vec<SandboxTerm>,
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub preferred: Vec<WeightedSandboxTerm>,
}

/// `hard` filters (placing here may not push the skew above `max_skew`); `soft` ranks (fewer
/// matching sandboxes in the pool's domain first).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpreadMode {
    /// Filter: placing here may not push the skew above `max_skew`.
    #[default]
    Hard,
    /// Rank: fewer matching sandboxes in the pool's domain ranks first.
    Soft,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpreadTerm {
    pub topology: TopologyKey,
    #[serde(default = "one")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000, default = 1))]
    pub max_skew: u32,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = "hard"))]
    pub mode: SpreadMode,
    /// Soft mode: penalty per matching sandbox in the domain.
    #[serde(default = "one")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000, default = 1))]
    pub weight: u32,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = openapi::Labels))]
    pub match_labels: BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

/// `"auto"` (workspace Auto order, else configured order) or an explicit list of provider names;
/// the entry `"standby"` places the Standby Pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Order {
    Auto(AutoKeyword),
    Providers(Vec<String>),
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AutoKeyword {
    #[serde(rename = "auto")]
    Auto,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Routing {
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub priorities: Vec<Priority>,
    /// Only this pool may be a candidate; every requirement still applies.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<openapi::Name>))]
    pub pin_pool: Option<String>,
    /// Required exact matches over pool labels and derived keys.
    #[cfg_attr(feature = "openapi", schema(value_type = openapi::Labels))]
    pub pool_selector: BTreeMap<String, String>,
    pub pool_affinity: PoolAffinity,
    pub sandbox_affinity: SandboxAffinity,
    pub sandbox_anti_affinity: SandboxAffinity,
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub spread: Vec<SpreadTerm>,
    pub order: Option<Order>,
    /// Append the Standby Pool to the order.
    pub standby: bool,
}

// ------------------------------------------------------------------------------ OpenAPI

/// OpenAPI schemas (cargo feature `openapi`) for what `#[derive(utoipa::ToSchema)]` cannot
/// say: the text rules of [`check_text`] (a [`Name`](openapi::Name), a
/// [`LabelValue`](openapi::LabelValue)), label maps (keys and values follow different rules),
/// the isolation mode (its `Deserialize` is hand-written), [`Source`] (externally tagged: an
/// object with exactly one key) and [`Order`] (untagged: the keyword or a list). Numeric
/// bounds are literals in the derive attributes; `tests::openapi_bounds_are_the_constants`
/// ties them to the `MAX_*` constants.
///
/// A JSON Schema `maxLength` counts characters while [`check_text`] counts UTF-8 bytes, so
/// the length bounds are necessary, not sufficient, for names with multi-byte characters;
/// no JSON Schema keyword counts bytes.
#[cfg(feature = "openapi")]
pub(crate) mod openapi {
    use std::borrow::Cow;

    use utoipa::openapi::schema::{
        AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
    };
    use utoipa::openapi::{Ref, RefOr};
    use utoipa::{PartialSchema, ToSchema};

    use super::{AutoKeyword, Order, Source};
    use super::{MAX_ENTRIES, MAX_NAME_BYTES, MAX_SOURCE_BYTES, MAX_VALUE_BYTES};

    /// The characters [`super::check_text`] refuses, as inclusive ranges: C0, DEL and C1
    /// (`char::is_control`), then the invisible formatting characters.
    pub(crate) const FORBIDDEN: [(char, char); 6] = [
        ('\u{0}', '\u{1F}'),
        ('\u{7F}', '\u{9F}'),
        ('\u{200B}', '\u{200F}'),
        ('\u{2028}', '\u{202E}'),
        ('\u{2060}', '\u{2069}'),
        ('\u{FEFF}', '\u{FEFF}'),
    ];

    /// `^[^<FORBIDDEN>]*$`, written with `\uXXXX` escapes (understood alike by ECMA-262,
    /// which JSON Schema's `pattern` is, and by other common regex engines).
    pub(crate) fn visible_pattern() -> String {
        let mut class = String::new();
        for (lo, hi) in FORBIDDEN {
            class.push_str(&format!("\\u{:04X}", lo as u32));
            if hi != lo {
                class.push_str(&format!("-\\u{:04X}", hi as u32));
            }
        }
        format!("^[^{class}]*$")
    }

    fn text(min_bytes: usize, max_bytes: usize) -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length((min_bytes > 0).then_some(min_bytes))
            .max_length(Some(max_bytes))
            .pattern(Some(visible_pattern()))
    }

    /// A provider, pool, region, VPC, GPU type, label key or other name.
    pub(crate) struct Name;

    impl PartialSchema for Name {
        fn schema() -> RefOr<Schema> {
            text(1, MAX_NAME_BYTES)
                .description(Some(format!(
                    "A name (provider, pool, region, VPC, GPU type, label key, ...): 1 to \
                     {MAX_NAME_BYTES} bytes of UTF-8, no control or invisible formatting \
                     characters."
                )))
                .into()
        }
    }

    impl ToSchema for Name {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("Name")
        }
    }

    /// A label, selector or expression value.
    pub(crate) struct LabelValue;

    impl PartialSchema for LabelValue {
        fn schema() -> RefOr<Schema> {
            text(0, MAX_VALUE_BYTES)
                .description(Some(format!(
                    "A label or selector value: at most {MAX_VALUE_BYTES} bytes of UTF-8 (may \
                     be empty), no control or invisible formatting characters."
                )))
                .into()
        }
    }

    impl ToSchema for LabelValue {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("LabelValue")
        }
    }

    /// A label map: keys are names, values label values, at most [`MAX_ENTRIES`] entries.
    pub(crate) struct Labels;

    impl PartialSchema for Labels {
        fn schema() -> RefOr<Schema> {
            // `propertyNames` takes a schema, not a reference: the key rules are inlined.
            let key = match Name::schema() {
                RefOr::T(key) => key,
                RefOr::Ref(_) => unreachable!("Name is an inline schema"),
            };
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(format!(
                    "Labels: at most {MAX_ENTRIES} entries; each key is a Name, each value a \
                     LabelValue."
                )))
                .max_properties(Some(MAX_ENTRIES))
                .property_names(Some(key))
                .additional_properties(Some(AdditionalProperties::RefOr(RefOr::Ref(
                    Ref::from_schema_name(LabelValue::name()),
                ))))
                .into()
        }
    }

    impl ToSchema for Labels {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("Labels")
        }

        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push((LabelValue::name().into(), LabelValue::schema()));
        }
    }

    /// `features.isolation`, as `IsolationMode`'s hand-written `Deserialize` reads it: a bare
    /// kind, or an object with a `kind` whose values are scalars (stored as their text).
    pub(crate) struct IsolationModeSchema;

    impl PartialSchema for IsolationModeSchema {
        fn schema() -> RefOr<Schema> {
            let scalar = || {
                ObjectBuilder::new().schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                    Type::Boolean,
                    Type::Number,
                    Type::String,
                ]))
            };
            OneOfBuilder::new()
                .description(Some(
                    "One complete isolation mode that a single mode of the pool must carry: a \
                     bare kind (`\"microvm\"`), or an object with a `kind` and any properties \
                     (`{\"kind\": \"microvm\", \"hypervisor\": \"firecracker\"}`); property \
                     values are booleans, numbers or strings, compared as text.",
                ))
                .item(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .description(Some("A kind, e.g. `microvm`, `vm`, `container`.")),
                )
                .item(
                    ObjectBuilder::new()
                        .schema_type(Type::Object)
                        .property("kind", scalar())
                        .required("kind")
                        .additional_properties(Some(scalar())),
                )
                .into()
        }
    }

    impl ToSchema for IsolationModeSchema {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("IsolationMode")
        }
    }

    /// Externally tagged: an object with exactly one of the three keys (serde refuses a map
    /// with more than one key and a bare variant name alike).
    impl PartialSchema for Source {
        fn schema() -> RefOr<Schema> {
            let variant = |key: &str, what: &str| {
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .title(Some(key))
                    .property(
                        key,
                        text(1, MAX_SOURCE_BYTES).description(Some(format!(
                            "{what}: 1 to {MAX_SOURCE_BYTES} bytes of UTF-8, no control or \
                             invisible formatting characters."
                        ))),
                    )
                    .required(key)
                    .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
            };
            OneOfBuilder::new()
                .description(Some(
                    "Exactly one of `{\"environment\": ...}`, `{\"image\": ...}`, \
                     `{\"template\": ...}`.",
                ))
                .item(variant(
                    "environment",
                    "A portable environment (seed 000), offered by the pools that declare it",
                ))
                .item(variant("image", "An OCI image reference"))
                .item(variant("template", "A provider template"))
                .into()
        }
    }

    impl ToSchema for Source {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("Source")
        }
    }

    /// Untagged: the keyword `"auto"` or a list of provider names, which must be unique.
    impl PartialSchema for Order {
        fn schema() -> RefOr<Schema> {
            OneOfBuilder::new()
                .description(Some(
                    "`\"auto\"` (the workspace Auto order, else the configured order) or an \
                     explicit list of provider names, each its own tier; the entry `\"standby\"` \
                     places the Standby Pool. Candidates must be unique.",
                ))
                .item(Ref::from_schema_name(AutoKeyword::name()))
                .item(
                    ArrayBuilder::new()
                        .items(Ref::from_schema_name(Name::name()))
                        .max_items(Some(MAX_ENTRIES))
                        .unique_items(true),
                )
                .into()
        }
    }

    impl ToSchema for Order {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("Order")
        }

        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push((AutoKeyword::name().into(), AutoKeyword::schema()));
            schemas.push((Name::name().into(), Name::schema()));
        }
    }
}

// ------------------------------------------------------------------------------ validation

/// A request field that is out of bounds: `field` is its path (`resources.cpu`,
/// `labels.team`, `routing.spread[0].max_skew`), `message` says what is allowed and never
/// quotes the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidField {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for InvalidField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for InvalidField {}

/// Most cores a request may ask for.
pub const MAX_CPU: f64 = 1024.0;
/// Most memory a request may ask for (16 TiB).
pub const MAX_MEMORY_MB: u64 = 16 * 1024 * 1024;
/// Most disk a request may ask for (64 TiB).
pub const MAX_DISK_GB: u64 = 64 * 1024;
/// Linux's own ceiling on process ids (`pid_max`).
pub const MAX_PIDS: u64 = 4 * 1024 * 1024;
/// Most GPUs a request may ask for.
pub const MAX_GPU: u32 = 64;
/// Largest weight or `max_skew`.
pub const MAX_WEIGHT: u32 = 1000;
/// Longest name (provider, pool, region, VPC, GPU type, label key, ...), in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest label or selector value, in bytes.
pub const MAX_VALUE_BYTES: usize = 256;
/// Longest source reference (image, environment, template), in bytes.
pub const MAX_SOURCE_BYTES: usize = 512;
/// Most entries in any list or map of a request.
pub const MAX_ENTRIES: usize = 64;

/// Why `text` is not acceptable as a name or label (`None` when it is): empty when
/// `allow_empty` is false, longer than `max_bytes`, or holding a control character (C0, DEL,
/// C1: NUL, CR, LF, ESC, ...) or an invisible formatting character (zero-width characters,
/// bidirectional overrides and isolates, line and paragraph separators, BOM), which could make
/// one name display as another in a log or a policy decision.
pub fn check_text(text: &str, max_bytes: usize, allow_empty: bool) -> Option<String> {
    if text.is_empty() && !allow_empty {
        return Some("must not be empty".into());
    }
    if text.len() > max_bytes {
        return Some(format!("must be at most {max_bytes} bytes"));
    }
    if text.chars().any(forbidden_char) {
        return Some("must not contain control or invisible formatting characters".into());
    }
    None
}

fn forbidden_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}' // zero-width space/joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}' // line/paragraph separators, bidi embeddings/overrides
            | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, bidi isolates
            | '\u{FEFF}' // BOM / zero-width no-break space
        )
}

struct Checker {
    at: String,
}

impl Checker {
    fn fail<T>(
        &self,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Result<T, InvalidField> {
        let field = field.into();
        Err(InvalidField {
            field: if self.at.is_empty() {
                field
            } else if field.is_empty() {
                self.at.clone()
            } else {
                format!("{}.{field}", self.at)
            },
            message: message.into(),
        })
    }

    fn text(
        &self,
        field: &str,
        text: &str,
        max: usize,
        allow_empty: bool,
    ) -> Result<(), InvalidField> {
        match check_text(text, max, allow_empty) {
            Some(message) => self.fail(field, message),
            None => Ok(()),
        }
    }

    fn name(&self, field: &str, text: &str) -> Result<(), InvalidField> {
        self.text(field, text, MAX_NAME_BYTES, false)
    }

    fn count(&self, field: &str, len: usize) -> Result<(), InvalidField> {
        if len > MAX_ENTRIES {
            return self.fail(field, format!("must have at most {MAX_ENTRIES} entries"));
        }
        Ok(())
    }

    fn names(&self, field: &str, names: &[String]) -> Result<(), InvalidField> {
        self.count(field, names.len())?;
        for (i, name) in names.iter().enumerate() {
            self.name(&format!("{field}[{i}]"), name)?;
        }
        Ok(())
    }

    /// Keys are names; a bad key is reported at the map, a bad value at `map.key`.
    fn labels(&self, field: &str, labels: &BTreeMap<String, String>) -> Result<(), InvalidField> {
        self.count(field, labels.len())?;
        for (key, value) in labels {
            if let Some(message) = check_text(key, MAX_NAME_BYTES, false) {
                return self.fail(field, format!("a key {message}"));
            }
            self.text(&format!("{field}.{key}"), value, MAX_VALUE_BYTES, true)?;
        }
        Ok(())
    }

    fn weight(&self, field: &str, weight: u32) -> Result<(), InvalidField> {
        if weight == 0 || weight > MAX_WEIGHT {
            return self.fail(field, format!("must be between 1 and {MAX_WEIGHT}"));
        }
        Ok(())
    }

    fn expr(&self, field: &str, key: &str, values: &[String]) -> Result<(), InvalidField> {
        self.name(&format!("{field}.key"), key)?;
        self.count(&format!("{field}.values"), values.len())?;
        for (i, value) in values.iter().enumerate() {
            self.text(
                &format!("{field}.values[{i}]"),
                value,
                MAX_VALUE_BYTES,
                true,
            )?;
        }
        Ok(())
    }

    fn affinity(&self, field: &str, a: &SandboxAffinity) -> Result<(), InvalidField> {
        self.count(&format!("{field}.required"), a.required.len())?;
        for (i, t) in a.required.iter().enumerate() {
            self.labels(
                &format!("{field}.required[{i}].match_labels"),
                &t.match_labels,
            )?;
        }
        self.count(&format!("{field}.preferred"), a.preferred.len())?;
        for (i, t) in a.preferred.iter().enumerate() {
            self.weight(&format!("{field}.preferred[{i}].weight"), t.weight)?;
            self.labels(
                &format!("{field}.preferred[{i}].match_labels"),
                &t.match_labels,
            )?;
        }
        Ok(())
    }
}

/// `a.b.c.d/n` or an IPv6 address with `/n`; a bare address is a host route.
fn valid_cidr(text: &str) -> bool {
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let Ok(addr) = addr.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    match prefix {
        None => true,
        Some(p) => {
            !p.is_empty()
                && p.len() <= 3
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u32>().is_ok_and(|n| n <= max)
        }
    }
}

impl Request {
    /// Checks bounds the types cannot express; see the module documentation. The first
    /// offending field is reported.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let c = Checker { at: String::new() };
        if let Some(p) = &self.provider {
            c.name("provider", p)?;
        }
        c.names("fallback_providers", &self.fallback_providers)?;
        // Seed 000: "Candidates must be unique." The explicit provider and its fallbacks
        // are one candidate list.
        let candidates: Vec<&String> = self
            .provider
            .iter()
            .chain(&self.fallback_providers)
            .collect();
        if let Some(i) = first_repeat(&candidates) {
            let at = i - usize::from(self.provider.is_some());
            return c.fail(
                format!("fallback_providers[{at}]"),
                format!(
                    "repeats provider {:?}: candidates must be unique",
                    candidates[i]
                ),
            );
        }
        if let Some(source) = &self.source {
            let (field, text) = match source {
                Source::Environment(t) => ("source.environment", t),
                Source::Image(t) => ("source.image", t),
                Source::Template(t) => ("source.template", t),
            };
            c.text(field, text, MAX_SOURCE_BYTES, false)?;
        }
        self.resources.validate()?;
        self.network.validate()?;
        c.names("regions", &self.regions)?;
        c.labels("labels", &self.labels)?;
        self.routing.validate()
    }
}

impl Resources {
    fn validate(&self) -> Result<(), InvalidField> {
        let c = Checker {
            at: "resources".into(),
        };
        if let Some(cpu) = self.cpu {
            if !cpu.is_finite() || cpu <= 0.0 || cpu > MAX_CPU {
                return c.fail(
                    "cpu",
                    format!("must be a number of cores above 0 and at most {MAX_CPU}"),
                );
            }
        }
        if let Some(m) = self.memory_mb {
            if m == 0 || m > MAX_MEMORY_MB {
                return c.fail(
                    "memory_mb",
                    format!("must be between 1 and {MAX_MEMORY_MB}"),
                );
            }
        }
        if let Some(d) = self.disk_gb {
            if d == 0 || d > MAX_DISK_GB {
                return c.fail("disk_gb", format!("must be between 1 and {MAX_DISK_GB}"));
            }
        }
        if let Some(n) = self.pids {
            if n == 0 || n > MAX_PIDS {
                return c.fail("pids", format!("must be between 1 and {MAX_PIDS}"));
            }
        }
        if let Some(g) = self.gpu {
            if g > MAX_GPU {
                return c.fail("gpu", format!("must be between 0 and {MAX_GPU}"));
            }
        }
        if let Some(t) = &self.gpu_type {
            c.name("gpu_type", t)?;
        }
        Ok(())
    }
}

impl Network {
    fn validate(&self) -> Result<(), InvalidField> {
        let c = Checker {
            at: "network".into(),
        };
        // Domain patterns themselves are checked by the gateway (`domain::validate_pattern`).
        if self.allow_domains.len() > 4 * MAX_ENTRIES {
            return c.fail(
                "allow_domains",
                format!("must have at most {} entries", 4 * MAX_ENTRIES),
            );
        }
        for (i, d) in self.allow_domains.iter().enumerate() {
            c.text(&format!("allow_domains[{i}]"), d, 253, false)?;
        }
        if self.cidrs.len() > 4 * MAX_ENTRIES {
            return c.fail(
                "cidrs",
                format!("must have at most {} entries", 4 * MAX_ENTRIES),
            );
        }
        for (i, cidr) in self.cidrs.iter().enumerate() {
            if !valid_cidr(cidr) {
                return c.fail(
                    format!("cidrs[{i}]"),
                    "must be an IP address or CIDR (address/prefix)",
                );
            }
        }
        if let Some(vpc) = &self.vpc {
            c.name("vpc", vpc)?;
        }
        Ok(())
    }
}

impl Routing {
    fn validate(&self) -> Result<(), InvalidField> {
        let c = Checker {
            at: "routing".into(),
        };
        c.count("priorities", self.priorities.len())?;
        if let Some(p) = &self.pin_pool {
            c.name("pin_pool", p)?;
        }
        c.labels("pool_selector", &self.pool_selector)?;
        let pa = &self.pool_affinity;
        c.count("pool_affinity.required", pa.required.len())?;
        for (i, e) in pa.required.iter().enumerate() {
            c.expr(&format!("pool_affinity.required[{i}]"), &e.key, &e.values)?;
        }
        c.count("pool_affinity.preferred", pa.preferred.len())?;
        for (i, e) in pa.preferred.iter().enumerate() {
            let at = format!("pool_affinity.preferred[{i}]");
            c.weight(&format!("{at}.weight"), e.weight)?;
            c.expr(&at, &e.key, &e.values)?;
        }
        c.affinity("sandbox_affinity", &self.sandbox_affinity)?;
        c.affinity("sandbox_anti_affinity", &self.sandbox_anti_affinity)?;
        c.count("spread", self.spread.len())?;
        for (i, t) in self.spread.iter().enumerate() {
            let at = format!("spread[{i}]");
            c.weight(&format!("{at}.max_skew"), t.max_skew)?;
            c.weight(&format!("{at}.weight"), t.weight)?;
            c.labels(&format!("{at}.match_labels"), &t.match_labels)?;
        }
        if let Some(Order::Providers(names)) = &self.order {
            c.names("order", names)?;
            let names: Vec<&String> = names.iter().collect();
            if let Some(i) = first_repeat(&names) {
                return c.fail(
                    format!("order[{i}]"),
                    format!("repeats provider {:?}: candidates must be unique", names[i]),
                );
            }
        }
        Ok(())
    }
}

/// The index of the first name that appeared earlier in `names`. The names were checked
/// as names first, so quoting one in an error is safe.
fn first_repeat(names: &[&String]) -> Option<usize> {
    let mut seen = std::collections::HashSet::new();
    names.iter().position(|n| !seen.insert(n.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: serde_json::Value) -> Result<(), InvalidField> {
        serde_json::from_value::<Request>(json).unwrap().validate()
    }

    fn field(json: serde_json::Value) -> String {
        check(json).unwrap_err().field
    }

    #[test]
    fn ordinary_requests_pass() {
        check(serde_json::json!({
            "resources": {"cpu": 0.5, "memory_mb": 512, "disk_gb": 10, "gpu": 0},
            "labels": {"app.kubernetes.io/name": "web", "empty": ""},
            "network": {"cidrs": ["10.0.0.0/8", "2001:db8::/32", "192.0.2.1"]},
            "routing": {"spread": [{"topology": "zone"}],
                        "pool_affinity": {"preferred": [{"weight": 100, "key": "gen", "values": ["4"]}]}},
            "source": {"image": "python:3.12"}, "regions": ["us-east-1"]
        }))
        .unwrap();
        check(serde_json::json!({})).unwrap();
    }

    #[test]
    fn resources_are_finite_positive_and_bounded() {
        for cpu in [-2.0, 0.0, 1e308, f64::NAN, f64::INFINITY, 1024.5] {
            let r = Request {
                resources: Resources {
                    cpu: Some(cpu),
                    ..Resources::default()
                },
                ..Request::default()
            };
            assert_eq!(r.validate().unwrap_err().field, "resources.cpu", "{cpu}");
        }
        assert_eq!(
            field(serde_json::json!({"resources": {"memory_mb": 0}})),
            "resources.memory_mb"
        );
        assert_eq!(
            field(serde_json::json!({"resources": {"disk_gb": u64::MAX}})),
            "resources.disk_gb"
        );
        assert_eq!(
            field(serde_json::json!({"resources": {"pids": 0}})),
            "resources.pids"
        );
        assert_eq!(
            field(serde_json::json!({"resources": {"gpu": 65}})),
            "resources.gpu"
        );
    }

    #[test]
    fn candidates_must_be_unique() {
        // Seed 000: "Candidates must be unique."
        let e =
            check(serde_json::json!({"provider": "e2b", "fallback_providers": ["daytona", "e2b"]}))
                .unwrap_err();
        assert_eq!(e.field, "fallback_providers[1]");
        assert!(e.message.contains("\"e2b\""), "{}", e.message);
        assert_eq!(
            field(serde_json::json!({"fallback_providers": ["a", "b", "a"]})),
            "fallback_providers[2]"
        );
        assert_eq!(
            field(serde_json::json!({"routing": {"order": ["e2b", "modal", "e2b"]}})),
            "routing.order[2]"
        );
        for ok in [
            serde_json::json!({"provider": "e2b", "fallback_providers": ["daytona"]}),
            serde_json::json!({"routing": {"order": ["e2b", "daytona"]}}),
        ] {
            assert!(check(ok.clone()).is_ok(), "{ok}");
        }
    }

    #[test]
    fn names_and_labels_have_no_control_characters() {
        assert_eq!(
            field(serde_json::json!({"labels": {"a\u{0}b": "x"}})),
            "labels"
        );
        assert_eq!(field(serde_json::json!({"labels": {"": "x"}})), "labels");
        assert_eq!(
            field(serde_json::json!({"labels": {"a": "x\ny"}})),
            "labels.a"
        );
        assert_eq!(
            field(serde_json::json!({"labels": {"a": "\u{202E}x"}})),
            "labels.a"
        );
        assert_eq!(
            field(serde_json::json!({"regions": ["ok", "us\u{7}"]})),
            "regions[1]"
        );
        assert_eq!(
            field(serde_json::json!({"routing": {"pool_selector": {"k\u{1b}": "v"}}})),
            "routing.pool_selector"
        );
        assert_eq!(
            field(
                serde_json::json!({"routing": {"pool_affinity": {"required": [{"key": "k\u{0}"}]}}})
            ),
            "routing.pool_affinity.required[0].key"
        );
        let long = "k".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(field(serde_json::json!({"provider": long})), "provider");
        // Whatever is refused, the message never quotes the value.
        let err = check(serde_json::json!({"labels": {"secret-ish\u{0}": "x"}})).unwrap_err();
        assert!(!err.message.contains("secret-ish"), "{err}");
    }

    /// The schema's literal bounds are the validation constants, its text pattern refuses
    /// exactly the characters [`check_text`] does, every `deny_unknown_fields` object is
    /// closed, and every struct's properties are its serde fields.
    #[cfg(feature = "openapi")]
    #[test]
    fn openapi_bounds_are_the_constants() {
        use utoipa::{PartialSchema, ToSchema};

        let mut all = Vec::new();
        <Request as ToSchema>::schemas(&mut all);
        all.push(("Request".into(), Request::schema()));
        let schemas: BTreeMap<String, serde_json::Value> = all
            .into_iter()
            .map(|(name, schema)| (name, serde_json::to_value(schema).unwrap()))
            .collect();
        let number = |schema: &str, pointer: &str| -> f64 {
            schemas[schema]
                .pointer(pointer)
                .and_then(serde_json::Value::as_f64)
                .unwrap_or_else(|| panic!("{schema}{pointer} is not a number"))
        };
        let unsigned = |n: u64| n as f64;

        assert_eq!(number("Resources", "/properties/cpu/exclusiveMinimum"), 0.0);
        assert_eq!(number("Resources", "/properties/cpu/maximum"), MAX_CPU);
        for (field, max) in [
            ("memory_mb", MAX_MEMORY_MB),
            ("disk_gb", MAX_DISK_GB),
            ("pids", MAX_PIDS),
            ("gpu", u64::from(MAX_GPU)),
        ] {
            let min = if field == "gpu" { 0.0 } else { 1.0 };
            assert_eq!(
                number("Resources", &format!("/properties/{field}/minimum")),
                min
            );
            assert_eq!(
                number("Resources", &format!("/properties/{field}/maximum")),
                unsigned(max),
                "{field}"
            );
        }
        for (schema, field) in [
            ("WeightedLabelExpr", "weight"),
            ("WeightedSandboxTerm", "weight"),
            ("SpreadTerm", "weight"),
            ("SpreadTerm", "max_skew"),
        ] {
            let at = format!("/properties/{field}");
            assert_eq!(number(schema, &format!("{at}/minimum")), 1.0);
            assert_eq!(
                number(schema, &format!("{at}/maximum")),
                unsigned(MAX_WEIGHT.into()),
                "{schema}.{field}"
            );
        }
        assert_eq!(number("Name", "/minLength"), 1.0);
        assert_eq!(number("Name", "/maxLength"), MAX_NAME_BYTES as f64);
        assert_eq!(number("LabelValue", "/maxLength"), MAX_VALUE_BYTES as f64);
        for i in 0..3 {
            let pointer = format!("/oneOf/{i}/properties");
            let (_, text) = schemas["Source"]
                .pointer(&pointer)
                .and_then(serde_json::Value::as_object)
                .and_then(|p| p.iter().next())
                .unwrap();
            assert_eq!(text["minLength"], 1);
            assert_eq!(text["maxLength"], MAX_SOURCE_BYTES);
        }
        assert_eq!(
            number("Network", "/properties/allow_domains/items/maxLength"),
            253.0
        );

        // Every list and map is bounded by MAX_ENTRIES, the egress lists by four times that.
        fn bounds(v: &serde_json::Value, at: String, out: &mut Vec<(String, u64)>) {
            match v {
                serde_json::Value::Object(o) => {
                    for key in ["maxItems", "maxProperties"] {
                        if let Some(n) = o.get(key).and_then(serde_json::Value::as_u64) {
                            out.push((at.clone(), n));
                        }
                    }
                    if o.get("type").is_some_and(|t| t == "array" || t == "object")
                        && !o.contains_key("maxItems")
                        && !o.contains_key("maxProperties")
                        && !o.contains_key("properties")
                    {
                        out.push((at.clone(), 0));
                    }
                    for (k, v) in o {
                        bounds(v, format!("{at}/{k}"), out);
                    }
                }
                serde_json::Value::Array(a) => {
                    for (i, v) in a.iter().enumerate() {
                        bounds(v, format!("{at}/{i}"), out);
                    }
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        for (name, schema) in &schemas {
            bounds(schema, name.clone(), &mut found);
        }
        for (at, n) in &found {
            // `default` values are examples, not schemas; the isolation mode's property map
            // is unbounded in the parser too.
            if at.contains("/default") || at.starts_with("IsolationMode") {
                continue;
            }
            let expected = if at.starts_with("Network/properties/") {
                4 * MAX_ENTRIES
            } else {
                MAX_ENTRIES
            };
            assert_eq!(*n, expected as u64, "{at}");
        }
        assert!(found.len() >= 14, "{found:?}");

        // The pattern's ranges are `forbidden_char`.
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let in_pattern = openapi::FORBIDDEN
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&c));
            assert_eq!(in_pattern, forbidden_char(c), "U+{:04X}", c as u32);
        }
        assert_eq!(schemas["Name"]["pattern"], openapi::visible_pattern());

        // Closed where the parser is; the top level is closed by the create body.
        let closed = [
            "Resources",
            "Features",
            "ProcessFeatures",
            "FilesystemFeatures",
            "Network",
            "LabelExpr",
            "WeightedLabelExpr",
            "PoolAffinity",
            "SandboxTerm",
            "WeightedSandboxTerm",
            "SandboxAffinity",
            "SpreadTerm",
            "Routing",
        ];
        for name in closed {
            assert_eq!(schemas[name]["additionalProperties"], false, "{name}");
        }
        assert!(schemas["Request"].get("additionalProperties").is_none());

        // Properties are exactly the serde fields.
        let keys = |v: serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let term = SpreadTerm {
            topology: TopologyKey::Zone,
            max_skew: 1,
            mode: SpreadMode::Soft,
            weight: 1,
            match_labels: BTreeMap::new(),
        };
        let expr = WeightedLabelExpr {
            weight: 1,
            key: "k".into(),
            operator: Operator::In,
            values: Vec::new(),
        };
        for (name, value) in [
            ("Request", serde_json::to_value(Request::default()).unwrap()),
            (
                "Resources",
                serde_json::to_value(Resources::default()).unwrap(),
            ),
            (
                "Features",
                serde_json::to_value(Features::default()).unwrap(),
            ),
            ("Network", serde_json::to_value(Network::default()).unwrap()),
            ("Routing", serde_json::to_value(Routing::default()).unwrap()),
            (
                "SandboxAffinity",
                serde_json::to_value(SandboxAffinity::default()).unwrap(),
            ),
            (
                "PoolAffinity",
                serde_json::to_value(PoolAffinity::default()).unwrap(),
            ),
            ("SpreadTerm", serde_json::to_value(term).unwrap()),
            ("WeightedLabelExpr", serde_json::to_value(expr).unwrap()),
        ] {
            assert_eq!(
                keys(value),
                keys(schemas[name]["properties"].clone()),
                "{name}"
            );
        }
    }

    #[test]
    fn weights_skews_and_cidrs_are_bounded() {
        assert_eq!(
            field(
                serde_json::json!({"routing": {"spread": [{"topology": "zone", "max_skew": 0}]}})
            ),
            "routing.spread[0].max_skew"
        );
        assert_eq!(
            field(
                serde_json::json!({"routing": {"pool_affinity": {"preferred": [{"weight": 0, "key": "k"}]}}})
            ),
            "routing.pool_affinity.preferred[0].weight"
        );
        assert_eq!(
            field(
                serde_json::json!({"routing": {"sandbox_affinity": {"preferred": [{"weight": 1001, "topology": "zone"}]}}})
            ),
            "routing.sandbox_affinity.preferred[0].weight"
        );
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/", "::/129", "1.2.3.4/+1"] {
            assert_eq!(
                field(serde_json::json!({"network": {"cidrs": [bad]}})),
                "network.cidrs[0]",
                "{bad}"
            );
        }
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("r{i}")).collect();
        assert_eq!(field(serde_json::json!({"regions": many})), "regions");
    }
}
