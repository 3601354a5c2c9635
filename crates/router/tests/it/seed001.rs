//! One test per rule of seed 001 ("Routing and policies": providers, accounts and pools;
//! requirements and preferences; placement choices), each quoting the rule.

use crate::common::*;
use sandgate_router::{route, ExistingSandbox, PoolStats, RouterConfig, Topology};
use serde_json::json;

/// Providers e2b, daytona, modal; accounts acct-<p>; pools given as `(name, provider, extra toml)`.
fn world(pools: &[(&str, &str, &str)]) -> Topology {
    let mut s = String::new();
    for p in ["e2b", "daytona", "modal"] {
        s += &format!("[[providers]]\nname = \"{p}\"\n[[accounts]]\nname = \"acct-{p}\"\nprovider = \"{p}\"\n");
    }
    for (n, p, extra) in pools {
        s += &pool_toml(n, p, extra);
    }
    topo(&s)
}

fn stats(latencies: &[f64], attempts: u64, successes: u64) -> PoolStats {
    PoolStats {
        startup_latency_ms: latencies.to_vec(),
        attempts,
        successes,
    }
}

fn sandbox(provider: &str, region: &str, zone: &str, labels: &[(&str, &str)]) -> ExistingSandbox {
    ExistingSandbox {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        provider: provider.into(),
        region: Some(region.into()),
        zone: Some(zone.into()),
    }
}

/// "Separate pools can use different accounts on one provider or accounts across providers. For
/// example, a route can try an E2B pool on account A, another E2B pool on account B, then a
/// Daytona pool on account C." / "Each attempt uses the selected pool's own credentials and
/// controls. A different pool does not inherit another account's authority."
#[test]
fn pools_carry_their_own_accounts() {
    let s = "[[providers]]\nname = \"e2b\"\n[[providers]]\nname = \"daytona\"\n\
             [[accounts]]\nname = \"A\"\nprovider = \"e2b\"\ncredential = \"env:E2B_A\"\n\
             [[accounts]]\nname = \"B\"\nprovider = \"e2b\"\ncredential = \"env:E2B_B\"\n\
             [[accounts]]\nname = \"C\"\nprovider = \"daytona\"\nbilling = \"past_due\"\n\
             [[pools]]\nname = \"p1\"\nprovider = \"e2b\"\naccount = \"A\"\n\
             [[pools]]\nname = \"p2\"\nprovider = \"e2b\"\naccount = \"B\"\n\
             [[pools]]\nname = \"p3\"\nprovider = \"daytona\"\naccount = \"C\"\n";
    let t = topo(s);
    let r = route(
        &t,
        &req(json!({"routing": {"order": ["e2b", "daytona"]}})),
        &ctx(),
    )
    .unwrap();
    let got: Vec<(String, String)> = r
        .candidates
        .iter()
        .map(|c| (c.pool.to_string(), c.account.to_string()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("p1".into(), "A".into()),
            ("p2".into(), "B".into()),
            ("p3".into(), "C".into())
        ]
    );
    // An account of another provider cannot back a pool.
    let bad = s.replace("account = \"C\"", "account = \"A\"");
    let cfg: RouterConfig = toml::from_str(&bad).unwrap();
    let e = cfg.validate().unwrap_err().to_string();
    assert_eq!(
        e,
        "pools[2].account: account \"A\" belongs to provider \"e2b\", not \"daytona\""
    );
}

/// "Routing first filters eligible pools, then ranks them. A preference never relaxes a
/// requirement."
#[test]
fn preference_never_relaxes_requirement() {
    let t = world(&[
        ("cheap", "modal", "price = 0.01"),
        ("dear", "e2b", "price = 9.0"),
    ]);
    let r = req(
        json!({"features": {"isolation": "microvm"}, "routing": {"priorities": ["price"],
        "pool_affinity": {"preferred": [{"weight": 100, "key": "pool", "values": ["cheap"]}]}}}),
    );
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["dear"]));
}

/// "Resources and capabilities: the requested size, image, GPU, execution, snapshot and
/// networking needs."
#[test]
fn resources_are_hard_requirements() {
    let t = world(&[
        ("small", "modal", ""),
        ("gpu", "modal", "[pools.resources]\ncpu = 32\nmemory_mb = 262144\ndisk_gb = 1000\ngpu = 8\ngpu_types = [\"h100\"]"),
    ]);
    let r = req(json!({"resources": {"cpu": 2, "memory_mb": 4096, "disk_gb": 10}}));
    assert_eq!(sorted(route_pools(&t, &r, &ctx())), strs(&["gpu", "small"]));
    let r = req(json!({"resources": {"memory_mb": 100000}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["gpu"]));
    let r = req(json!({"resources": {"gpu": 1, "gpu_type": "h100"}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["gpu"]));
    let e = no_eligible(
        &t,
        &req(json!({"resources": {"gpu": 16, "gpu_type": "a100", "cpu": 64}})),
        &ctx(),
    );
    assert_eq!(
        unmet_for(&e, "small"),
        strs(&["resources.cpu", "resources.gpu", "resources.gpu_type"])
    );
    assert_eq!(
        unmet_for(&e, "gpu"),
        strs(&["resources.cpu", "resources.gpu", "resources.gpu_type"])
    );
}

/// "Location: a geography, normalized region or provider-specific zone."
#[test]
fn location_geography_region_zone() {
    let t = world(&[
        ("us1", "e2b", "geography = \"us\"\nzone = \"us-east-1a\""),
        ("us2", "e2b", "geography = \"us\"\nzone = \"us-east-1b\""),
        ("eu1", "e2b", "geography = \"eu\""),
    ]);
    let r = req(json!({"routing": {"pool_selector": {"geography": "us"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["us1", "us2"]));
    let r = req(json!({"routing": {"pool_selector": {"zone": "us-east-1b"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["us2"]));
    let r = req(json!({"routing": {"pool_selector": {"region": "US_EAST_1"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()).len(), 3);
    let e = no_eligible(
        &t,
        &req(json!({"routing": {"pool_selector": {"geography": "ap"}}})),
        &ctx(),
    );
    assert_eq!(
        unmet_for(&e, "eu1"),
        strs(&["routing.pool_selector.geography"])
    );
}

/// "Provider and isolation: selected providers or an isolation mode such as a particular microVM
/// hypervisor."
#[test]
fn provider_and_isolation_mode_with_hypervisor() {
    let t = world(&[
        (
            "fc",
            "e2b",
            "isolation = [{ kind = \"microvm\", hypervisor = \"firecracker\" }]",
        ),
        (
            "ch",
            "e2b",
            "isolation = [{ kind = \"microvm\", hypervisor = \"cloud-hypervisor\" }]",
        ),
        ("ct", "modal", ""),
    ]);
    let r =
        req(json!({"features": {"isolation": {"kind": "microvm", "hypervisor": "firecracker"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["fc"]));
    let r = req(json!({"features": {"isolation": "microvm"}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["ch", "fc"]));
    let r = req(json!({"provider": "modal", "fallback_providers": []}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["ct"]));
}

/// "Security and compliance: requirements expressed through the pool's published labels,
/// including tenancy, compliance and confidential computing."
#[test]
fn security_and_compliance_labels() {
    let t = world(&[
        ("shared", "e2b", "labels = { tenancy = \"shared\" }"),
        ("dedicated", "e2b", "labels = { tenancy = \"dedicated\", compliance = \"hipaa\", confidential = \"sev-snp\" }"),
    ]);
    let r =
        req(json!({"routing": {"pool_selector": {"tenancy": "dedicated", "compliance": "hipaa"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["dedicated"]));
    let r = req(
        json!({"routing": {"pool_affinity": {"required": [{"key": "confidential", "operator": "exists"}]}}}),
    );
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["dedicated"]));
    let e = no_eligible(
        &t,
        &req(json!({"routing": {"pool_selector": {"compliance": "fedramp"}}})),
        &ctx(),
    );
    assert_eq!(
        unmet_for(&e, "shared"),
        strs(&["routing.pool_selector.compliance"])
    );
}

/// "Network placement: a bound VPC restricts placement to its topology. Routing cannot move that
/// sandbox to an unrelated network."
#[test]
fn bound_vpc_restricts_placement() {
    let t = world(&[
        ("a", "e2b", "vpc = \"vpc-1\""),
        ("b", "e2b", "vpc = \"vpc-2\""),
        ("c", "e2b", ""),
    ]);
    assert_eq!(
        route_pools(&t, &req(json!({"network": {"vpc": "vpc-2"}})), &ctx()),
        strs(&["b"])
    );
    let e = no_eligible(&t, &req(json!({"network": {"vpc": "vpc-9"}})), &ctx());
    assert_eq!(unmet_for(&e, "c"), strs(&["network.vpc"]));
}

/// "A pool that does not satisfy a requirement is excluded, even if it is cheaper or starts
/// faster. If none qualifies, creation cannot proceed with a weaker requirement."
#[test]
fn excluded_even_if_cheaper_or_faster_and_no_weakening() {
    let t = world(&[
        ("fast", "modal", "price = 0.1"),
        ("slow", "e2b", "price = 5.0"),
    ]);
    let mut c = ctx();
    c.stats.insert("fast".into(), stats(&[100.0], 10, 10));
    c.stats.insert("slow".into(), stats(&[9000.0], 10, 5));
    let r = req(
        json!({"features": {"pause_resume": true}, "routing": {"priorities": ["startup_latency", "price"]}}),
    );
    assert_eq!(route_pools(&t, &r, &c), strs(&["slow"]));
    let r = req(json!({"features": {"pause_resume": true, "isolation": "vm"}}));
    let e = no_eligible(&t, &r, &c);
    assert_eq!(
        unmet_for(&e, "fast"),
        strs(&["features.isolation", "features.pause_resume"])
    );
}

/// "| Price | The pool's configured price | Lower |"
#[test]
fn price_lower_first() {
    let t = world(&[
        ("a", "e2b", "price = 3.0"),
        ("b", "e2b", "price = 1.0"),
        ("c", "e2b", "price = 2.0"),
    ]);
    let r = req(json!({"routing": {"priorities": ["price"]}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["b", "c", "a"]));
}

/// "| Startup latency | Measured time from a creation attempt to the sandbox running on that pool
/// | Lower |" and "A measured metric uses its median."
#[test]
fn startup_latency_median_lower_first() {
    let t = world(&[("a", "e2b", ""), ("b", "e2b", "")]);
    let mut c = ctx();
    c.bands.startup_latency_ms = 0.0;
    // Means would prefer b (a has one huge outlier); medians prefer a.
    c.stats.insert(
        "a".into(),
        stats(&[100.0, 110.0, 120.0, 100_000.0, 90.0], 0, 0),
    );
    c.stats
        .insert("b".into(), stats(&[500.0, 500.0, 500.0], 0, 0));
    let r = req(json!({"routing": {"priorities": ["startup_latency"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["a", "b"]));
}

/// "| Creation success | The share of eligible creation attempts that reached a running sandbox |
/// Higher |"
#[test]
fn creation_success_higher_first() {
    let t = world(&[("a", "e2b", ""), ("b", "e2b", ""), ("c", "e2b", "")]);
    let mut c = ctx();
    c.stats.insert("a".into(), stats(&[], 100, 70));
    c.stats.insert("b".into(), stats(&[], 100, 99));
    c.stats.insert("c".into(), stats(&[], 100, 85));
    let r = req(json!({"routing": {"priorities": ["creation_success"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["b", "c", "a"]));
}

/// "Priorities are ordered. For example, startup latency, creation success, price favors faster
/// starts first, uses creation success to distinguish comparable candidates, then considers
/// price. Price, startup latency favors lower cost first."
#[test]
fn priorities_are_ordered() {
    let t = world(&[
        ("fast-dear", "e2b", "price = 9.0"),
        ("slow-cheap", "e2b", "price = 1.0"),
    ]);
    let mut c = ctx();
    c.stats.insert("fast-dear".into(), stats(&[200.0], 10, 10));
    c.stats
        .insert("slow-cheap".into(), stats(&[3000.0], 10, 10));
    let r =
        req(json!({"routing": {"priorities": ["startup_latency", "creation_success", "price"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["fast-dear", "slow-cheap"]));
    let r = req(json!({"routing": {"priorities": ["price", "startup_latency"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["slow-cheap", "fast-dear"]));
}

/// "Measured values are compared in bands so small differences do not overwhelm the next
/// priority. ... Within a band, the next metric ranks the tied candidates."
#[test]
fn measured_values_compared_in_bands() {
    let t = world(&[
        ("a", "e2b", "price = 5.0"),
        ("b", "e2b", "price = 1.0"),
        ("c", "e2b", "price = 0.5"),
    ]);
    let mut c = ctx();
    c.bands.startup_latency_ms = 250.0;
    c.stats.insert("a".into(), stats(&[510.0], 0, 0)); // band 2
    c.stats.insert("b".into(), stats(&[740.0], 0, 0)); // band 2: same band, cheaper wins
    c.stats.insert("c".into(), stats(&[760.0], 0, 0)); // band 3: cheapest but slower band
    let r = req(json!({"routing": {"priorities": ["startup_latency", "price"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["b", "a", "c"]));
    // Exact comparison (width 0) lets the 230 ms difference decide.
    c.bands.startup_latency_ms = 0.0;
    assert_eq!(route_pools(&t, &r, &c), strs(&["a", "b", "c"]));
    // Success bands: 0.97 and 0.99 are comparable at 0.05; price decides.
    let mut c = ctx();
    c.stats.insert("a".into(), stats(&[], 100, 99));
    c.stats.insert("b".into(), stats(&[], 100, 97));
    c.stats.insert("c".into(), stats(&[], 100, 80));
    let r = req(json!({"routing": {"priorities": ["creation_success", "price"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["b", "a", "c"]));
}

/// "Pools without a value for a requested metric follow those that have one."
#[test]
fn pools_without_value_follow() {
    let t = world(&[
        ("a", "e2b", ""),
        ("b", "e2b", "price = 100.0"),
        ("c", "e2b", "price = 1.0"),
    ]);
    let mut c = ctx();
    c.stats.insert("a".into(), stats(&[], 0, 0)); // no samples, no attempts
    c.stats.insert("c".into(), stats(&[900.0], 4, 1));
    let r = req(json!({"routing": {"priorities": ["price"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["c", "b", "a"]));
    let r = req(json!({"routing": {"priorities": ["startup_latency"]}}));
    assert_eq!(route_pools(&t, &r, &c), strs(&["c", "a", "b"]));
    let r = req(json!({"routing": {"priorities": ["creation_success"]}}));
    assert_eq!(route_pools(&t, &r, &c)[0], "c");
}

/// "“Lowest cost in US East” means: 1. Keep only pools in US East that satisfy the image, size,
/// capabilities and other hard requirements. 2. Rank those pools by price, followed by any
/// secondary priorities. 3. Attempt creation in that order" / "If the cheapest matching pool is
/// full, failover can try the next matching pool. It cannot leave US East unless the
/// requirements permit another region."
#[test]
fn lowest_cost_in_us_east() {
    let t = world(&[
        ("use-modal", "modal", "price = 2.0"),
        ("use-daytona", "daytona", "price = 1.0"),
        ("use-e2b", "e2b", "price = 0.5"),
        (
            "euw-daytona",
            "daytona",
            "price = 0.1\nregion = \"eu-west-1\"",
        ),
    ]);
    let r = req(
        json!({"source": {"image": "python:3.12"}, "regions": ["us-east-1"], "resources": {"memory_mb": 2048},
        "routing": {"priorities": ["price", "startup_latency"]}}),
    );
    let mut c = ctx();
    c.free_capacity.insert("use-daytona".into(), 0);
    assert_eq!(route_pools(&t, &r, &c), strs(&["use-daytona", "use-modal"]));
}

/// "| Pin a pool | Use one exact destination; capability, capacity and authorization checks still
/// apply |" and "A pinned pool leaves no alternative pool to rank or fail over to."
#[test]
fn pin_a_pool() {
    let t = world(&[("a", "e2b", ""), ("b", "modal", "")]);
    let r = req(json!({"routing": {"pin_pool": "b"}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["b"]));
    let e = no_eligible(
        &t,
        &req(json!({"routing": {"pin_pool": "b"}, "features": {"isolation": "microvm"}})),
        &ctx(),
    );
    // Only the pinned pool is explained: the others' one reason would be the pin itself.
    assert_eq!(e.details.attempts.len(), 1, "{:?}", e.details.attempts);
    assert_eq!(unmet_for(&e, "b"), strs(&["features.isolation"]));
    let e = no_eligible(
        &t,
        &req(json!({"routing": {"pin_pool": "missing"}})),
        &ctx(),
    );
    assert_eq!(e.details.attempts.len(), 2);
}

/// "| Select pool labels | Require matching provider, geography, region, isolation or security
/// properties |"
#[test]
fn select_pool_labels() {
    let t = world(&[
        ("a", "e2b", "labels = { tier = \"prod\" }"),
        ("b", "modal", "labels = { tier = \"prod\" }"),
        ("c", "e2b", ""),
    ]);
    let r = req(json!({"routing": {"pool_selector": {"provider": "e2b", "tier": "prod"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["a"]));
    let r = req(json!({"routing": {"pool_selector": {"isolation": "container"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["b"]));
    let r = req(json!({"routing": {"pool_selector": {"account": "acct-modal", "egress": "none"}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["b"]));
}

/// "| Pool affinity | Express required matches and weighted preferences over pool labels |"
#[test]
fn pool_affinity_required_and_weighted() {
    let t = world(&[
        ("a", "e2b", "labels = { disk = \"ssd\", gen = \"3\" }"),
        ("b", "e2b", "labels = { disk = \"ssd\", gen = \"4\" }"),
        ("c", "e2b", "labels = { disk = \"hdd\", gen = \"4\" }"),
    ]);
    let r = req(json!({"routing": {"pool_affinity": {
        "required": [{"key": "disk", "operator": "not_in", "values": ["hdd"]}],
        "preferred": [{"weight": 10, "key": "gen", "values": ["4"]}]}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["b", "a"]));
    let r = req(json!({"routing": {"pool_affinity": {"preferred": [
        {"weight": 10, "key": "gen", "values": ["4"]}, {"weight": 20, "key": "disk", "values": ["hdd"]}]}}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["c", "b", "a"]));
    let e = no_eligible(
        &t,
        &req(json!({"routing": {"pool_affinity": {"required": [
        {"key": "gen", "values": ["4"]}, {"key": "gpu", "operator": "exists"}]}}})),
        &ctx(),
    );
    assert_eq!(
        unmet_for(&e, "a"),
        strs(&[
            "routing.pool_affinity.required[0]",
            "routing.pool_affinity.required[1]"
        ])
    );
}

fn zoned() -> Topology {
    world(&[
        ("z1", "e2b", "zone = \"z1\""),
        ("z2", "e2b", "zone = \"z2\""),
        ("z3", "modal", "zone = \"z3\"\nregion = \"eu-west-1\""),
    ])
}

/// "| Sandbox affinity | Place near matching sandboxes within a provider, region or zone |"
#[test]
fn sandbox_affinity_within_topology() {
    let t = zoned();
    let mut c = ctx();
    c.sandboxes
        .push(sandbox("e2b", "us-east-1", "z2", &[("app", "db")]));
    let term = |topo: &str| json!({"routing": {"sandbox_affinity": {"required": [{"topology": topo, "match_labels": {"app": "db"}}]}}});
    assert_eq!(route_pools(&t, &req(term("zone")), &c), strs(&["z2"]));
    assert_eq!(
        route_pools(&t, &req(term("region")), &c),
        strs(&["z1", "z2"])
    );
    assert_eq!(
        route_pools(&t, &req(term("provider")), &c),
        strs(&["z1", "z2"])
    );
    let e = no_eligible(&t, &req(term("zone")), &{
        let mut c = c.clone();
        c.sandboxes[0].zone = Some("elsewhere".into());
        c
    });
    assert_eq!(
        unmet_for(&e, "z1"),
        strs(&["routing.sandbox_affinity.required[0]"])
    );
    // The first of a group that matches its own term may go anywhere.
    let mut r = term("zone");
    r["labels"] = json!({"app": "db"});
    assert_eq!(route_pools(&t, &req(r), &ctx()).len(), 3);
    // Preferred affinity ranks.
    let r = req(
        json!({"routing": {"sandbox_affinity": {"preferred": [{"weight": 5, "topology": "zone", "match_labels": {"app": "db"}}]}}}),
    );
    assert_eq!(route_pools(&t, &r, &c)[0], "z2");
}

/// "| Sandbox anti-affinity | Keep away from matching sandboxes within the chosen topology |"
#[test]
fn sandbox_anti_affinity_within_topology() {
    let t = zoned();
    let mut c = ctx();
    c.sandboxes
        .push(sandbox("e2b", "us-east-1", "z1", &[("app", "web")]));
    let term = |topo: &str| json!({"routing": {"sandbox_anti_affinity": {"required": [{"topology": topo, "match_labels": {"app": "web"}}]}}});
    assert_eq!(route_pools(&t, &req(term("zone")), &c), strs(&["z2", "z3"]));
    assert_eq!(route_pools(&t, &req(term("region")), &c), strs(&["z3"]));
    let e = no_eligible(&t, &req(term("provider")), &{
        let mut c = c.clone();
        c.sandboxes
            .push(sandbox("modal", "eu-west-1", "z3", &[("app", "web")]));
        c
    });
    assert_eq!(
        unmet_for(&e, "z3"),
        strs(&["routing.sandbox_anti_affinity.required[0]"])
    );
    let r = req(
        json!({"routing": {"priorities": ["price"], "sandbox_anti_affinity": {"preferred": [{"weight": 5, "topology": "zone", "match_labels": {"app": "web"}}]}}}),
    );
    assert_eq!(route_pools(&t, &r, &c), strs(&["z2", "z3", "z1"]));
    // Without priorities the configured provider order (e2b before modal) outranks preferences.
    let r = req(
        json!({"routing": {"sandbox_anti_affinity": {"preferred": [{"weight": 5, "topology": "zone", "match_labels": {"app": "web"}}]}}}),
    );
    assert_eq!(route_pools(&t, &r, &c), strs(&["z2", "z1", "z3"]));
}

/// "| Spread | Balance matching workloads across providers, regions or zones, as a hard rule or a
/// preference |" and "Hard spread rules filter candidates; soft spread and affinity preferences
/// help rank candidates left tied by the route metrics."
#[test]
fn spread_hard_and_soft() {
    let t = zoned();
    let mut c = ctx();
    for z in ["z1", "z1", "z2"] {
        c.sandboxes
            .push(sandbox("e2b", "us-east-1", z, &[("job", "crawl")]));
    }
    // counts z1=2, z2=1, z3=0: max_skew 1 allows only z3 (0+1-0=1); z2 would be 2.
    let hard = json!({"routing": {"spread": [{"topology": "zone", "max_skew": 1, "match_labels": {"job": "crawl"}}]}});
    assert_eq!(route_pools(&t, &req(hard), &c), strs(&["z3"]));
    let hard2 = json!({"routing": {"spread": [{"topology": "zone", "max_skew": 2, "match_labels": {"job": "crawl"}}]}});
    assert_eq!(
        route_pools(&t, &req(hard2.clone()), &c),
        strs(&["z2", "z3"])
    );
    let mut c2 = c.clone();
    c2.sandboxes
        .push(sandbox("e2b", "us-east-1", "z1", &[("job", "crawl")]));
    // Among the us-east-1 pools (z1=3, z2=1) the minimum is 1: z1 would make the skew 3.
    let r = req(
        json!({"regions": ["us-east-1"], "routing": {"spread": [{"topology": "zone", "max_skew": 1}]}}),
    );
    assert_eq!(route_pools(&t, &r, &c2), strs(&["z2"]));
    let r = req(json!({"routing": {"spread": [{"topology": "zone", "max_skew": 0}]}}));
    let e = no_eligible(&t, &r, &c2);
    assert!(e
        .details
        .attempts
        .iter()
        .all(|a| a.unmet_requirements == strs(&["routing.spread[0]"])));
    // Soft spread ranks the emptier zone first but filters nothing; metrics still come first.
    // (`priorities` without values puts every provider in one tier, so only the soft score differs.)
    let soft = json!({"routing": {"priorities": ["price"], "spread": [{"topology": "zone", "mode": "soft", "match_labels": {"job": "crawl"}}]}});
    assert_eq!(route_pools(&t, &req(soft), &c), strs(&["z3", "z2", "z1"]));
    let t2 = world(&[
        ("z1", "e2b", "zone = \"z1\"\nprice = 1.0"),
        ("z3", "e2b", "zone = \"z3\"\nprice = 2.0"),
    ]);
    let soft = json!({"routing": {"priorities": ["price"], "spread": [{"topology": "zone", "mode": "soft", "match_labels": {"job": "crawl"}}]}});
    assert_eq!(route_pools(&t2, &req(soft), &c), strs(&["z1", "z3"]));
}

/// "Capacity and a deterministic name order resolve remaining ties."
#[test]
fn capacity_then_name_resolve_ties() {
    let t = world(&[
        ("c", "e2b", "capacity = 5"),
        ("a", "e2b", ""),
        ("b", "e2b", ""),
        ("d", "e2b", "capacity = 50"),
    ]);
    let mut c = ctx();
    c.free_capacity.insert("b".into(), 10);
    assert_eq!(
        route_pools(&t, &req(json!({})), &c),
        strs(&["d", "b", "c", "a"])
    );
    assert_eq!(
        route_pools(&t, &req(json!({})), &ctx()),
        strs(&["d", "c", "a", "b"])
    );
}

/// "Pool requirements combine. An isolation requirement must match one complete isolation mode
/// offered by the pool, rather than mixing properties from different modes."
#[test]
fn isolation_matches_one_complete_mode() {
    let t = world(&[
        ("mixed", "e2b", "isolation = [{ kind = \"microvm\", hypervisor = \"firecracker\" }, { kind = \"microvm\", hypervisor = \"qemu\", confidential = true }]"),
        ("whole", "e2b", "isolation = [{ kind = \"microvm\", hypervisor = \"firecracker\", confidential = true }]"),
    ]);
    let r = req(
        json!({"features": {"isolation": {"kind": "microvm", "hypervisor": "firecracker", "confidential": "true"}}}),
    );
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["whole"]));
    // Combined with another requirement, both must hold.
    let r = req(
        json!({"features": {"isolation": {"kind": "microvm", "confidential": "true"}}, "routing": {"pool_selector": {"pool": "mixed"}}}),
    );
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["mixed"]));
}

/// "An explicit order is the order supplied by the caller; it does not implicitly sort providers
/// by price. A provider omitted from that order is not used."
#[test]
fn explicit_order_not_sorted_and_omissions_unused() {
    let t = world(&[
        ("e", "e2b", "price = 9.0"),
        ("d", "daytona", "price = 1.0"),
        ("m", "modal", "price = 5.0"),
    ]);
    let r = req(json!({"routing": {"order": ["modal", "e2b"], "priorities": ["price"]}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["m", "e"]));
    let e = no_eligible(
        &t,
        &req(json!({"routing": {"order": ["modal"]}, "regions": ["x"]})),
        &ctx(),
    );
    assert_eq!(unmet_for(&e, "d"), strs(&["routing.order", "regions"]));
}

/// "The explicit-order interface also supports a workspace Auto order, a per-create override and a
/// named provider."
#[test]
fn workspace_auto_order_override_and_named_provider() {
    let t = world(&[("e", "e2b", ""), ("d", "daytona", ""), ("m", "modal", "")]);
    let mut c = ctx();
    c.workspace_order = Some(strs(&["daytona", "e2b"]));
    assert_eq!(route_pools(&t, &req(json!({})), &c), strs(&["d", "e"]));
    assert_eq!(
        route_pools(&t, &req(json!({"routing": {"order": "auto"}})), &c),
        strs(&["d", "e"])
    );
    assert_eq!(
        route_pools(
            &t,
            &req(json!({"routing": {"order": ["modal", "daytona"]}})),
            &c
        ),
        strs(&["m", "d"])
    );
    assert_eq!(
        route_pools(&t, &req(json!({"provider": "modal"})), &c),
        strs(&["m"])
    );
    assert_eq!(
        route_pools(&t, &req(json!({"fallback_providers": ["modal"]})), &c),
        strs(&["m", "d", "e"])
    );
}

/// "The Standby Pool is a fallback only when the order includes it and it satisfies the request."
#[test]
fn standby_pool_only_when_ordered_and_qualifying() {
    let t = world(&[
        ("e", "e2b", ""),
        ("sb", "modal", "standby = true"),
        ("m", "modal", ""),
    ]);
    assert_eq!(route_pools(&t, &req(json!({})), &ctx()), strs(&["e", "m"]));
    let r = req(json!({"routing": {"order": ["e2b", "standby", "modal"]}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["e", "sb", "m"]));
    let r = req(json!({"routing": {"standby": true}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["e", "m", "sb"]));
    let r = req(json!({"routing": {"standby": true}, "features": {"isolation": "microvm"}}));
    assert_eq!(route_pools(&t, &r, &ctx()), strs(&["e"]));
    let e = no_eligible(&t, &req(json!({"regions": ["x"]})), &ctx());
    assert_eq!(unmet_for(&e, "sb"), strs(&["routing.standby", "regions"]));
}
