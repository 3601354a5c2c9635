//! Configuration: TOML shape, strictness, validation errors naming the key, built-in defaults.

use crate::common::*;
use sandgate_router::{EgressEnforcement, IsolationMode, ProviderKind, RouterConfig};

const FULL: &str = r#"
[[providers]]
name = "e2b"

[[providers]]
name = "sim"
kind = "simulated"
[providers.capabilities]
isolation = ["microvm", { kind = "vm", confidential = true }]
egress = "gateway"
[providers.capabilities.features]
pty = true

[[accounts]]
name = "acct-a"
provider = "e2b"
credential = "env:E2B_API_KEY"
billing = "good"
labels = { team = "infra" }

[[accounts]]
name = "acct-sim"
provider = "sim"

[[pools]]
name = "e2b-use1"
provider = "e2b"
account = "acct-a"
geography = "us"
region = "us-east-1"
zone = "us-east-1a"
isolation = [{ kind = "microvm", hypervisor = "firecracker" }]
labels = { tenancy = "dedicated", compliance = "soc2" }
vpc = "vpc-1"
price = 0.12
capacity = 40
egress = "native"
[pools.resources]
cpu = 8
memory_mb = 16384
disk_gb = 100
[pools.sources]
template = true
templates = ["base"]
[pools.features.filesystem]
write = false

[[pools]]
name = "standby"
provider = "sim"
account = "acct-sim"
standby = true
"#;

fn parse(s: &str) -> RouterConfig {
    toml::from_str(s).unwrap_or_else(|e| panic!("{e}"))
}

fn errors(s: &str) -> Vec<String> {
    parse(s)
        .validate()
        .unwrap_err()
        .0
        .iter()
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn full_config_parses_and_compiles() {
    let t = parse(&FULL.replace("name = \"standby\"", "name = \"sb\""))
        .compile()
        .unwrap();
    let p = t.pool("e2b-use1").unwrap();
    assert_eq!(p.capabilities.egress, EgressEnforcement::Native);
    assert_eq!(
        p.capabilities.isolation,
        vec![IsolationMode::kind("microvm").with("hypervisor", "firecracker")]
    );
    assert!(!p.capabilities.filesystem.write && p.capabilities.filesystem.read);
    assert_eq!(p.capabilities.templates, Some(vec!["base".to_string()]));
    let sim = t.provider("sim").unwrap();
    assert_eq!(sim.kind, ProviderKind::Simulated);
    assert!(sim.capabilities.pty);
    assert_eq!(
        sim.capabilities.isolation[1],
        IsolationMode::kind("vm").with("confidential", "true")
    );
    assert_eq!(
        t.pool("sb").unwrap().capabilities.egress,
        EgressEnforcement::Gateway
    );
}

#[test]
fn reserved_name_standby_is_rejected() {
    assert_eq!(
        errors(FULL),
        vec!["pools[1].name: \"standby\" is reserved for routing orders"]
    );
}

#[test]
fn unknown_fields_are_rejected() {
    for bad in [
        "[[providers]]\nname = \"e2b\"\nflavour = 1\n",
        "[[accounts]]\nname = \"a\"\nprovider = \"e2b\"\nsecret = \"x\"\n",
        "[[pools]]\nname = \"p\"\nprovider = \"e2b\"\naccount = \"a\"\negres = \"native\"\n",
        "[[pools]]\nname = \"p\"\nprovider = \"e2b\"\naccount = \"a\"\n[pools.features]\nptty = true\n",
        "[[pools]]\nname = \"p\"\nprovider = \"e2b\"\naccount = \"a\"\negress = \"strict\"\n",
    ] {
        let err = toml::from_str::<RouterConfig>(bad).expect_err(bad).to_string();
        assert!(err.contains("unknown"), "{bad}: {err}");
    }
}

#[test]
fn validation_errors_name_the_offending_key() {
    let s = r#"
[[providers]]
name = "e2b"
[[providers]]
name = "e2b"
[[providers]]
name = "acme"
[[accounts]]
name = "a"
provider = "e2b"
[[accounts]]
name = "b"
provider = "nope"
[[pools]]
name = "p0"
provider = "e2b"
account = "a"
[[pools]]
name = "p1"
provider = "e2b"
account = "a"
price = -1.0
isolation = ["vm"]
labels = { region = "x" }
[[pools]]
name = "p2"
provider = "e2b"
account = "acct-x"
[[pools]]
name = "p0"
provider = "ghost"
account = "a"
[[pools]]
name = "p4"
provider = "e2b"
account = "a"
[pools.sources]
image = true
[pools.features]
public_ports = true
"#;
    assert_eq!(
        errors(s),
        vec![
            "providers[1].name: duplicate provider \"e2b\"",
            "providers[2].kind: missing, and \"acme\" is not a built-in provider kind",
            "accounts[1].provider: unknown provider \"nope\"",
            "pools[1].isolation[0]: provider \"e2b\" declares no isolation mode that {\"kind\": \"vm\"} refines",
            "pools[1].labels.region: reserved key; it is derived from the pool itself",
            "pools[1].price: must be a finite number >= 0",
            "pools[2].account: unknown account \"acct-x\"",
            "pools[3].name: duplicate pool \"p0\"",
            "pools[3].provider: unknown provider \"ghost\"",
            "pools[4].sources.image: provider \"e2b\" does not support OCI images",
            "pools[4].features.public_ports: provider \"e2b\" does not declare this capability",
        ]
    );
}

#[test]
fn builtin_defaults_follow_seed_000() {
    let caps = |k: ProviderKind| k.builtin_capabilities();
    for k in ProviderKind::ALL {
        let c = caps(k);
        assert_eq!(
            c.environments,
            vec!["metal/base", "metal/node", "metal/python"],
            "{k}"
        );
        // Seed 000 had no kind declare pty; issue 31 gave local sandboxes terminal
        // sessions, so the local kind declares it now, and only it.
        assert_eq!(c.pty, k == ProviderKind::Local, "{k}: pty");
        assert_eq!(c.process.execute, c.filesystem.read, "{k}");
    }
    assert!(!caps(ProviderKind::Codesandbox).process.execute);
    assert!(!caps(ProviderKind::Northflank).filesystem.write);
    assert!(caps(ProviderKind::Northflank).isolation.is_empty());
    let local = caps(ProviderKind::Local);
    assert_eq!(local.isolation, vec![IsolationMode::kind("namespace")]);
    assert!(local.pause_resume && local.process.cancel && local.filesystem.mkdir);
    assert_eq!(local.egress, EgressEnforcement::Gateway);
    for k in ProviderKind::ALL {
        if k != ProviderKind::Local {
            assert_eq!(
                caps(k).egress,
                EgressEnforcement::None,
                "{k}: no managed adapter enforces egress"
            );
        }
    }
    assert_eq!(
        ProviderKind::from_name("prime-intellect"),
        Some(ProviderKind::PrimeIntellect)
    );
}

#[test]
fn requests_reject_unknown_requirement_fields() {
    for bad in [
        serde_json::json!({"features": {"gpu_passthrough": true}}),
        serde_json::json!({"network": {"allow": ["x"]}}),
        serde_json::json!({"routing": {"priority": ["price"]}}),
        serde_json::json!({"routing": {"priorities": ["cheapest"]}}),
        serde_json::json!({"source": {"docker": "x"}}),
    ] {
        assert!(
            serde_json::from_value::<sandgate_router::Request>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    // The rest of the create body is not the router's business.
    let r = req(serde_json::json!({"workspace": "w", "credentials": ["gh"], "provider": "e2b"}));
    assert_eq!(r.provider.as_deref(), Some("e2b"));
}
