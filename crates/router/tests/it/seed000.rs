//! One test per rule of seed 000 ("Routing and capabilities"), each quoting the rule.

use crate::common::*;
use sandgate_router::{route, NO_ELIGIBLE_PROVIDER};
use serde_json::json;

fn three() -> sandgate_router::Topology {
    topo(&providers_toml(&["e2b", "modal", "daytona"]))
}

/// "Automatic selection tries explicit fallback providers first, then other configured managed or
/// BYOK providers in their configured order."
#[test]
fn automatic_selection_tries_fallbacks_then_configured_order() {
    let t = three();
    let r = req(json!({"fallback_providers": ["daytona"]}));
    assert_eq!(route_providers(&t, &r), strs(&["daytona", "e2b", "modal"]));
    let r = req(json!({}));
    assert_eq!(route_providers(&t, &r), strs(&["e2b", "modal", "daytona"]));
}

/// "An explicit provider is primary. Listed fallback providers follow in order. Candidates must
/// be unique."
#[test]
fn explicit_provider_is_primary_fallbacks_follow_unique() {
    let t = three();
    let r = req(json!({"provider": "modal", "fallback_providers": ["e2b", "modal", "e2b"]}));
    let got = route(&t, &r, &ctx()).unwrap();
    assert_eq!(pools(&got), strs(&["modal-1", "e2b-1"]));
    // Not named: not a candidate when a provider is explicit.
    let e = no_eligible(
        &t,
        &req(json!({"provider": "modal", "regions": ["eu-west-1"]})),
        &ctx(),
    );
    assert_eq!(unmet_for(&e, "daytona-1"), strs(&["provider", "regions"]));
}

/// "OpenMetal does not currently calculate cheapest, fastest, reliable, or balanced rankings."
/// sandgate does: `priorities: ["price"]` reorders across providers.
#[test]
fn sandgate_ranks_cheapest_across_providers() {
    let mut s = providers_toml(&["e2b", "modal", "daytona"]);
    s = s.replace("name = \"e2b-1\"\n", "name = \"e2b-1\"\nprice = 3.0\n");
    s = s.replace("name = \"modal-1\"\n", "name = \"modal-1\"\nprice = 1.0\n");
    s = s.replace(
        "name = \"daytona-1\"\n",
        "name = \"daytona-1\"\nprice = 2.0\n",
    );
    let t = topo(&s);
    let r = req(json!({"routing": {"priorities": ["price"]}}));
    assert_eq!(route_providers(&t, &r), strs(&["modal", "daytona", "e2b"]));
}

/// "Portable environments work across all current providers."
#[test]
fn portable_environments_work_across_all_providers() {
    let t = managed();
    for env in ["metal/base", "metal/node", "metal/python"] {
        let r = req(no_baseline(json!({"source": {"environment": env}})));
        assert_eq!(
            sorted(route_providers(&t, &r)),
            sorted(strs(&MANAGED)),
            "{env}"
        );
    }
}

/// "OCI images work with Blaxel, Daytona, Modal, Northflank, and Vercel."
#[test]
fn oci_images_work_with_listed_providers() {
    let t = managed();
    let r = req(no_baseline(json!({"source": {"image": "python:3.12"}})));
    assert_eq!(
        sorted(route_providers(&t, &r)),
        sorted(strs(&[
            "blaxel",
            "daytona",
            "modal",
            "northflank",
            "vercel"
        ]))
    );
    let e = no_eligible(
        &t,
        &req(json!({"provider": "e2b", "source": {"image": "x"}})),
        &ctx(),
    );
    assert_eq!(unmet_for(&e, "e2b-1"), strs(&["source.image"]));
}

/// "Provider templates work with CodeSandbox, E2B, Freestyle, and Runloop."
#[test]
fn provider_templates_work_with_listed_providers() {
    let t = managed();
    let r = req(no_baseline(json!({"source": {"template": "base"}})));
    assert_eq!(
        sorted(route_providers(&t, &r)),
        sorted(strs(&["codesandbox", "e2b", "freestyle", "runloop"]))
    );
}

/// "Recognized portable environments are metal/base, metal/node, and metal/python."
#[test]
fn only_recognized_portable_environments() {
    let t = managed();
    let e = no_eligible(
        &t,
        &req(json!({"source": {"environment": "metal/ruby"}})),
        &ctx(),
    );
    assert!(e.details.attempts.iter().all(|a| a
        .unmet_requirements
        .contains(&"source.environment".to_string())));
    let bad = "[[providers]]\nname = \"e2b\"\n[providers.capabilities.sources]\nenvironments = [\"metal/ruby\"]\n";
    let cfg: sandgate_router::RouterConfig = toml::from_str(bad).unwrap();
    let err = cfg.validate().unwrap_err().to_string();
    assert!(
        err.contains("providers[0].capabilities.sources.environments"),
        "{err}"
    );
}

/// A pin is not an explicit provider: "Explicit providers only need what you request"
/// (seed 000), while for a pinned pool "capability, capacity and authorization checks still
/// apply" (seed 001). Pinning a lifecycle-only pool with an otherwise automatic request is
/// refused, and only the pinned pool is explained, with its unmet baseline.
#[test]
fn a_pin_keeps_the_portable_baseline() {
    let t = managed();
    let pin = json!({"routing": {"pin_pool": "codesandbox-1"}});
    let e = no_eligible(&t, &req(pin), &ctx());
    assert_eq!(e.details.attempts.len(), 1, "{:?}", e.details.attempts);
    let unmet = unmet_for(&e, "codesandbox-1");
    assert!(
        unmet.contains(&"features.process.execute".to_string()),
        "{unmet:?}"
    );
    // Naming the provider as well makes it explicit: only what is requested applies.
    let named = json!({"routing": {"pin_pool": "codesandbox-1"}, "provider": "codesandbox"});
    assert_eq!(
        route_pools(&t, &req(named), &ctx()),
        strs(&["codesandbox-1"])
    );
    // A pinned pool that meets the baseline is the one candidate.
    let ok = json!({"routing": {"pin_pool": "e2b-1"}});
    assert_eq!(route_pools(&t, &req(ok), &ctx()), strs(&["e2b-1"]));
}

/// "CodeSandbox and Northflank adapters currently expose lifecycle only, without process
/// execution or file access, so automatic routing never selects them."
#[test]
fn lifecycle_only_providers_never_selected_automatically() {
    let t = managed();
    let auto = route_providers(&t, &req(json!({})));
    assert_eq!(auto.len(), 9);
    assert!(!auto.contains(&"codesandbox".into()) && !auto.contains(&"northflank".into()));
    let e = no_eligible(
        &t,
        &req(json!({"routing": {"pin_pool": "northflank-1"}, "provider": "e2b"})),
        &ctx(),
    );
    assert!(unmet_for(&e, "northflank-1").contains(&"provider".to_string()));
    // Named explicitly, they only need what is requested.
    assert_eq!(
        route_providers(&t, &req(json!({"provider": "codesandbox"}))),
        strs(&["codesandbox"])
    );
    // ...and the request's own needs still apply.
    let e = no_eligible(
        &t,
        &req(json!({"provider": "northflank", "features": {"process": {"execute": true}}})),
        &ctx(),
    );
    assert_eq!(
        unmet_for(&e, "northflank-1"),
        strs(&["features.process.execute"])
    );
}

/// "Current public process streaming works with Cloudflare, E2B, Modal, and Vercel. Request
/// features.process.ordered_output to route only to them."
#[test]
fn ordered_output_routes_only_to_streaming_providers() {
    let t = managed();
    let r = req(json!({"features": {"process": {"ordered_output": true}}}));
    assert_eq!(
        sorted(route_providers(&t, &r)),
        sorted(strs(&["cloudflare", "e2b", "modal", "vercel"]))
    );
}

/// "Process cancellation is not confirmed for those adapters."
#[test]
fn process_cancel_not_confirmed_for_managed_adapters() {
    let t = managed();
    let e = no_eligible(
        &t,
        &req(json!({"features": {"process": {"cancel": true}}})),
        &ctx(),
    );
    assert!(unmet_for(&e, "e2b-1").contains(&"features.process.cancel".to_string()));
    let t = topo(&providers_toml(&["e2b", "local"]));
    assert_eq!(
        route_providers(&t, &req(json!({"features": {"process": {"cancel": true}}}))),
        strs(&["local"])
    );
}

/// "Filesystem read and write support is broader. List, delete, append, and parent creation vary
/// by provider; request them under features.filesystem when you depend on them."
#[test]
fn filesystem_extras_route_only_to_declaring_providers() {
    let t = managed();
    assert_eq!(
        route_providers(
            &t,
            &req(json!({"features": {"filesystem": {"read": true, "write": true}}}))
        )
        .len(),
        9
    );
    for f in ["list", "delete", "append", "mkdir"] {
        let e = no_eligible(
            &t,
            &req(json!({"features": {"filesystem": {f: true}}})),
            &ctx(),
        );
        assert!(unmet_for(&e, "modal-1").contains(&format!("features.filesystem.{f}")));
    }
    let s = "[[providers]]\nname = \"modal\"\n[providers.capabilities.features.filesystem]\nlist = true\n\n[[providers]]\nname = \"e2b\"\n\n[[accounts]]\nname = \"acct-modal\"\nprovider = \"modal\"\n[[accounts]]\nname = \"acct-e2b\"\nprovider = \"e2b\"\n"
        .to_string()
        + &pool_toml("modal-1", "modal", "")
        + &pool_toml("e2b-1", "e2b", "");
    let t = topo(&s);
    assert_eq!(
        route_providers(
            &t,
            &req(json!({"features": {"filesystem": {"list": true}}}))
        ),
        strs(&["modal"])
    );
}

/// "features.public_ports | Blaxel only."
#[test]
fn public_ports_blaxel_only() {
    let t = managed();
    assert_eq!(
        route_providers(&t, &req(json!({"features": {"public_ports": true}}))),
        strs(&["blaxel"])
    );
}

/// "Reliable pause and resume are available through CodeSandbox, E2B, Freestyle, Northflank, and
/// Runloop. Daytona pause reporting is inconsistent."
#[test]
fn pause_resume_only_reliable_providers() {
    let t = managed();
    let r = req(no_baseline(json!({"features": {"pause_resume": true}})));
    assert_eq!(
        sorted(route_providers(&t, &r)),
        sorted(strs(&[
            "codesandbox",
            "e2b",
            "freestyle",
            "northflank",
            "runloop"
        ]))
    );
    let e = no_eligible(
        &t,
        &req(json!({"provider": "daytona", "features": {"pause_resume": true}})),
        &ctx(),
    );
    assert_eq!(unmet_for(&e, "daytona-1"), strs(&["features.pause_resume"]));
}

/// "features.isolation | Provider-reported microVM: Blaxel, CodeSandbox, E2B, Runloop, Vercel.
/// VM: Freestyle, Prime Intellect. Container: Cloudflare, Daytona, Modal. Northflank is unknown
/// and never qualifies."
#[test]
fn isolation_table_and_northflank_never_qualifies() {
    let t = managed();
    let table: [(&str, &[&str]); 3] = [
        (
            "microvm",
            &["blaxel", "codesandbox", "e2b", "runloop", "vercel"],
        ),
        ("vm", &["freestyle", "prime-intellect"]),
        ("container", &["cloudflare", "daytona", "modal"]),
    ];
    for (kind, want) in table {
        let r = req(no_baseline(json!({"features": {"isolation": kind}})));
        assert_eq!(
            sorted(route_providers(&t, &r)),
            sorted(strs(want)),
            "{kind}"
        );
    }
    for kind in ["microvm", "vm", "container", "namespace"] {
        let r = req(json!({"provider": "northflank", "features": {"isolation": kind}}));
        let e = no_eligible(&t, &r, &ctx());
        assert_eq!(unmet_for(&e, "northflank-1"), strs(&["features.isolation"]));
    }
}

/// "features.pty | Never satisfied. Interactive PTY sessions are not part of the API."
/// sandgate: never by a provider that does not declare it (no built-in one does).
#[test]
fn pty_never_satisfied_by_undeclaring_providers() {
    let t = topo(&providers_toml(&MANAGED));
    let e = no_eligible(
        &t,
        &req(no_baseline(json!({"features": {"pty": true}}))),
        &ctx(),
    );
    assert_eq!(e.details.attempts.len(), 11);
    assert!(e
        .details
        .attempts
        .iter()
        .all(|a| a.unmet_requirements == vec!["features.pty".to_string()]));
    // Local sandboxes have terminal sessions (issue 31, after seed 000): among every kind,
    // the local pool alone qualifies.
    let all = topo(&providers_toml(&[&MANAGED[..], &["local"]].concat()));
    assert_eq!(
        route_providers(&all, &req(no_baseline(json!({"features": {"pty": true}})))),
        strs(&["local"])
    );
    // A pool cannot claim pty for a provider that does not declare it.
    let s = providers_toml(&["e2b"]).replace(
        "[pools.resources]",
        "[pools.features]\npty = true\n[pools.resources]",
    );
    let cfg: sandgate_router::RouterConfig = toml::from_str(&s).unwrap();
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("pools[0].features.pty"));
    // A simulated provider that declares it qualifies.
    let s = "[[providers]]\nname = \"sim\"\nkind = \"simulated\"\n[providers.capabilities.features]\npty = true\n[[accounts]]\nname = \"acct-sim\"\nprovider = \"sim\"\n".to_string()
        + &pool_toml("sim-1", "sim", "");
    assert_eq!(
        route_providers(&topo(&s), &req(json!({"features": {"pty": true}}))),
        strs(&["sim"])
    );
}

/// "network restrictions | Never satisfied yet. No adapter enforces outbound restrictions, so
/// requests that restrict egress fail closed."
/// sandgate: satisfied only by pools whose egress enforcement is `native` or `gateway`.
#[test]
fn network_restrictions_only_native_or_gateway() {
    let mut s = providers_toml(&["e2b"]);
    for (n, e) in [
        ("e-native", "native"),
        ("e-gateway", "gateway"),
        ("e-advisory", "advisory"),
        ("e-none", "none"),
    ] {
        s += &pool_toml(n, "e2b", &format!("egress = \"{e}\""));
    }
    let t = topo(&s);
    for net in [
        json!({"allow_domains": ["pypi.org"]}),
        json!({"deny_all": true}),
        json!({"cidrs": ["10.0.0.0/8"]}),
    ] {
        let r = req(json!({"network": net}));
        assert_eq!(
            sorted(route_pools(&t, &r, &ctx())),
            strs(&["e-gateway", "e-native"])
        );
    }
    // Built-in providers default to `none`: fail closed.
    let e = no_eligible(
        &managed(),
        &req(json!({"network": {"allow_domains": ["pypi.org"]}})),
        &ctx(),
    );
    assert!(unmet_for(&e, "e2b-1").contains(&"network.allow_domains".to_string()));
    let r = req(json!({"provider": "e2b", "network": {"allow_domains": ["a"], "deny_all": true}}));
    let e = no_eligible(&topo(&providers_toml(&["e2b"])), &r, &ctx());
    assert_eq!(
        unmet_for(&e, "e2b-1"),
        strs(&["network.allow_domains", "network.deny_all"])
    );
    // Unrestricted requests still use every pool.
    assert_eq!(route_pools(&t, &req(json!({})), &ctx()).len(), 5);
}

/// "regions | Never satisfied yet. No adapter declares every region it may place a sandbox in."
/// sandgate: satisfied only by pools that declare a listed (normalized) region.
#[test]
fn regions_only_by_declaring_pools() {
    let mut s = providers_toml(&["e2b"]);
    s += &pool_toml("eu", "e2b", "region = \"EU_West_1\"");
    s += &pool_toml("nowhere", "e2b", "#noregion");
    let t = topo(&s);
    assert_eq!(
        route_pools(&t, &req(json!({"regions": ["eu-west-1"]})), &ctx()),
        strs(&["eu"])
    );
    assert_eq!(
        sorted(route_pools(
            &t,
            &req(json!({"regions": ["US-EAST-1", "eu_west_1"]})),
            &ctx()
        )),
        strs(&["e2b-1", "eu"])
    );
    let e = no_eligible(&t, &req(json!({"regions": ["ap-south-1"]})), &ctx());
    assert_eq!(unmet_for(&e, "nowhere"), strs(&["regions"]));
}

/// "Source, resources, features, network, and regions are hard requirements. Before calling a
/// candidate, OpenMetal removes it if its declared capabilities cannot satisfy every requirement,
/// records each unmet requirement on the provider attempt, and moves to the next candidate."
#[test]
fn every_unmet_requirement_is_recorded_per_attempt() {
    let t = managed();
    let r = req(json!({
        "source": {"image": "python:3.12"},
        "resources": {"memory_mb": 131072},
        "features": {"isolation": "vm"},
        "network": {"allow_domains": ["pypi.org"]},
        "regions": ["eu-west-1"]
    }));
    let e = no_eligible(&t, &r, &ctx());
    assert_eq!(
        unmet_for(&e, "e2b-1"),
        strs(&[
            "source.image",
            "resources.memory_mb",
            "features.isolation",
            "network.allow_domains",
            "regions"
        ])
    );
    assert_eq!(
        unmet_for(&e, "freestyle-1"),
        strs(&[
            "source.image",
            "resources.memory_mb",
            "network.allow_domains",
            "regions"
        ])
    );
}

/// "When no candidate qualifies, the create operation fails with no_eligible_provider.
/// error.details.attempts lists each provider with its unmet_requirements, for example
/// ["isolation", "network.allow_domains"]."
#[test]
fn no_eligible_provider_error_shape() {
    let t = topo(&providers_toml(&["e2b", "modal"]));
    let e = no_eligible(
        &t,
        &req(json!({"features": {"isolation": "vm"}, "network": {"allow_domains": ["x"]}})),
        &ctx(),
    );
    assert_eq!(e.code, NO_ELIGIBLE_PROVIDER);
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["code"], "no_eligible_provider");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("no eligible provider"));
    assert_eq!(
        v["details"]["attempts"],
        json!([
            {"provider": "e2b", "pool": "e2b-1", "unmet_requirements": ["features.isolation", "network.allow_domains"]},
            {"provider": "modal", "pool": "modal-1", "unmet_requirements": ["features.isolation", "network.allow_domains"]}
        ])
    );
}

/// "Automatic routing adds a portable baseline: process execution plus file read and write. Set
/// features.process.execute, features.filesystem.read, or features.filesystem.write to false to
/// opt out. Explicit providers only need what you request."
#[test]
fn portable_baseline_and_opt_out() {
    let t = managed();
    let e = no_eligible(
        &t,
        &req(json!({"fallback_providers": ["codesandbox"], "regions": ["x"]})),
        &ctx(),
    );
    assert_eq!(
        unmet_for(&e, "codesandbox-1"),
        strs(&[
            "features.process.execute",
            "features.filesystem.read",
            "features.filesystem.write",
            "regions"
        ])
    );
    let r =
        req(json!({"features": {"process": {"execute": false}, "filesystem": {"read": false}}}));
    assert_eq!(route_providers(&t, &r).len(), 9, "write still required");
    let r = req(no_baseline(json!({})));
    let got = route(&t, &r, &ctx()).unwrap();
    assert_eq!(got.candidates.len(), 11);
    let r = req(json!({"provider": "northflank"}));
    let got = route(&t, &r, &ctx()).unwrap();
    assert_eq!(pools(&got), strs(&["northflank-1"]));
    assert!(!got.candidates[0].baseline);
}
