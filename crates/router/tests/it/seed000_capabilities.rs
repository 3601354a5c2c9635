//! The built-in capability defaults of every managed provider kind, field by field against
//! seed 000's capability table, transcribed below as data.
//!
//! Source: seed 000, "Routing and capabilities", sections "Source support", "Runtime support"
//! and "Hard requirements" (its `Requirement | Current support` table). Quoted per column.
//!
//! Not compared, because the router has no field for them:
//! - "Portable leased HTTP endpoints are currently available through Blaxel and Daytona."
//!   (no capability or request feature models leased endpoints; they are not
//!   `features.public_ports`, which the table gives to Blaxel only);
//! - "regions | Never satisfied yet." (regions are declared per pool, not by a kind).

use crate::common::MANAGED;
use sandgate_router::{Capabilities, EgressEnforcement, IsolationMode, ProviderKind};
use ProviderKind::*;

/// One provider's row of the seed's table.
struct Row {
    kind: ProviderKind,
    /// "features.isolation | Provider-reported microVM: Blaxel, CodeSandbox, E2B, Runloop,
    /// Vercel. VM: Freestyle, Prime Intellect. Container: Cloudflare, Daytona, Modal.
    /// Northflank is unknown and never qualifies." (`None`: unknown.)
    isolation: Option<&'static str>,
    /// "OCI images work with Blaxel, Daytona, Modal, Northflank, and Vercel."
    image: bool,
    /// "Provider templates work with CodeSandbox, E2B, Freestyle, and Runloop."
    template: bool,
    /// "CodeSandbox and Northflank adapters currently expose lifecycle only, without process
    /// execution or file access" (`false` for those two); "Filesystem read and write support
    /// is broader" (every other provider reads and writes files).
    execute_and_files: bool,
    /// "Current public process streaming works with Cloudflare, E2B, Modal, and Vercel.
    /// Request features.process.ordered_output to route only to them."
    ordered_output: bool,
    /// "Reliable pause and resume are available through CodeSandbox, E2B, Freestyle,
    /// Northflank, and Runloop. Daytona pause reporting is inconsistent."
    pause_resume: bool,
    /// "features.public_ports | Blaxel only."
    public_ports: bool,
}

const fn row(
    kind: ProviderKind,
    isolation: Option<&'static str>,
    (image, template): (bool, bool),
    execute_and_files: bool,
    ordered_output: bool,
    pause_resume: bool,
    public_ports: bool,
) -> Row {
    Row {
        kind,
        isolation,
        image,
        template,
        execute_and_files,
        ordered_output,
        pause_resume,
        public_ports,
    }
}

/// Seed 000's table, one row per managed provider (the seed's eleven).
#[rustfmt::skip]
const SEED_000: [Row; 11] = [
    //   kind            isolation          (image, template) exec+files ordered pause  ports
    row(Blaxel,         Some("microvm"),   (true,  false),   true,      false,  false, true ),
    row(Codesandbox,    Some("microvm"),   (false, true ),   false,     false,  true,  false),
    row(E2b,            Some("microvm"),   (false, true ),   true,      true,   true,  false),
    row(Runloop,        Some("microvm"),   (false, true ),   true,      false,  true,  false),
    row(Vercel,         Some("microvm"),   (true,  false),   true,      true,   false, false),
    row(Freestyle,      Some("vm"),        (false, true ),   true,      false,  true,  false),
    row(PrimeIntellect, Some("vm"),        (false, false),   true,      false,  false, false),
    row(Cloudflare,     Some("container"), (false, false),   true,      true,   false, false),
    row(Daytona,        Some("container"), (true,  false),   true,      false,  false, false),
    row(Modal,          Some("container"), (true,  false),   true,      true,   false, false),
    row(Northflank,     None,              (true,  false),   false,     false,  true,  false),
];

/// What the seed says of every provider alike.
mod every_provider {
    /// "Recognized portable environments are metal/base, metal/node, and metal/python."
    /// and "Portable environments work across all current providers."
    pub const ENVIRONMENTS: [&str; 3] = ["metal/base", "metal/node", "metal/python"];
    /// "Process cancellation is not confirmed for those adapters." (none confirms it)
    pub const CANCEL: bool = false;
    /// "List, delete, append, and parent creation vary by provider": the seed confirms them
    /// for none, so none is declared (a requirement on them fails closed).
    pub const FILESYSTEM_EXTRAS: bool = false;
    /// "features.pty | Never satisfied."
    pub const PTY: bool = false;
    /// "network restrictions | Never satisfied yet. No adapter enforces outbound
    /// restrictions, so requests that restrict egress fail closed."
    pub const EGRESS: sandgate_router::EgressEnforcement = sandgate_router::EgressEnforcement::None;
}

/// Every field of `code` that differs from the seed's row, as `kind.field: seed …, code …`.
fn differences(seed: &Row, code: &Capabilities) -> Vec<String> {
    let kind = seed.kind;
    let mut out = Vec::new();
    let mut check = |field: &str, want: String, got: String| {
        if want != got {
            out.push(format!("{kind}.{field}: seed {want}, code {got}"));
        }
    };
    let isolation: Vec<IsolationMode> = seed
        .isolation
        .map(IsolationMode::kind)
        .into_iter()
        .collect();
    let environments: Vec<String> = every_provider::ENVIRONMENTS
        .iter()
        .map(|s| s.to_string())
        .collect();
    let files = seed.execute_and_files;
    let extras = every_provider::FILESYSTEM_EXTRAS;
    let fields: [(&str, String, String); 17] = [
        (
            "sources.environments",
            format!("{environments:?}"),
            format!("{:?}", code.environments),
        ),
        (
            "sources.image",
            seed.image.to_string(),
            code.image.to_string(),
        ),
        (
            "sources.template",
            seed.template.to_string(),
            code.template.to_string(),
        ),
        (
            "sources.templates",
            "None".into(),
            format!("{:?}", code.templates),
        ),
        (
            "isolation",
            format!("{isolation:?}"),
            format!("{:?}", code.isolation),
        ),
        (
            "process.execute",
            files.to_string(),
            code.process.execute.to_string(),
        ),
        (
            "process.ordered_output",
            seed.ordered_output.to_string(),
            code.process.ordered_output.to_string(),
        ),
        (
            "process.cancel",
            every_provider::CANCEL.to_string(),
            code.process.cancel.to_string(),
        ),
        (
            "filesystem.read",
            files.to_string(),
            code.filesystem.read.to_string(),
        ),
        (
            "filesystem.write",
            files.to_string(),
            code.filesystem.write.to_string(),
        ),
        (
            "filesystem.list",
            extras.to_string(),
            code.filesystem.list.to_string(),
        ),
        (
            "filesystem.delete",
            extras.to_string(),
            code.filesystem.delete.to_string(),
        ),
        (
            "filesystem.append",
            extras.to_string(),
            code.filesystem.append.to_string(),
        ),
        (
            "filesystem.mkdir",
            extras.to_string(),
            code.filesystem.mkdir.to_string(),
        ),
        (
            "public_ports",
            seed.public_ports.to_string(),
            code.public_ports.to_string(),
        ),
        (
            "pause_resume",
            seed.pause_resume.to_string(),
            code.pause_resume.to_string(),
        ),
        ("pty", every_provider::PTY.to_string(), code.pty.to_string()),
    ];
    for (field, want, got) in fields {
        check(field, want, got);
    }
    check(
        "egress",
        every_provider::EGRESS.as_str().into(),
        code.egress.as_str().into(),
    );
    out
}

#[test]
fn the_table_covers_every_managed_kind_once() {
    let mut table: Vec<&str> = SEED_000.iter().map(|r| r.kind.as_str()).collect();
    let mut managed: Vec<&str> = ProviderKind::ALL
        .into_iter()
        .filter(|k| !matches!(k, Local | Simulated))
        .map(ProviderKind::as_str)
        .collect();
    let mut seed_list = MANAGED.to_vec();
    table.sort();
    managed.sort();
    seed_list.sort();
    assert_eq!(table, managed);
    assert_eq!(table, seed_list);
}

#[test]
fn builtin_capabilities_of_every_managed_kind_match_seed_000_field_by_field() {
    let differences: Vec<String> = SEED_000
        .iter()
        .flat_map(|row| differences(row, &row.kind.builtin_capabilities()))
        .collect();
    assert!(
        differences.is_empty(),
        "built-in capabilities disagree with seed 000:\n{}",
        differences.join("\n")
    );
    // The comparison itself notices a difference (it is not vacuous).
    let mut changed = Blaxel.builtin_capabilities();
    changed.public_ports = false;
    changed.egress = EgressEnforcement::Native;
    assert_eq!(
        differences_of(Blaxel, &changed),
        vec![
            "blaxel.public_ports: seed true, code false",
            "blaxel.egress: seed none, code native"
        ]
    );
}

fn differences_of(kind: ProviderKind, code: &Capabilities) -> Vec<String> {
    let row = SEED_000.iter().find(|r| r.kind == kind).unwrap();
    differences(row, code)
}
