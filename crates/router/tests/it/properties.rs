//! Property tests over random topologies, requests and contexts.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use sandgate_router::*;

const PROVIDERS: [&str; 5] = ["e2b", "modal", "daytona", "local", "sim"];
const REGIONS: [&str; 3] = ["us-east-1", "eu-west-1", "ap-south-1"];
const ZONES: [&str; 4] = ["za", "zb", "zc", "zd"];
const EGRESS: [EgressEnforcement; 4] = [
    EgressEnforcement::Native,
    EgressEnforcement::Gateway,
    EgressEnforcement::Advisory,
    EgressEnforcement::None,
];
const ISOLATION: [&str; 4] = ["microvm", "vm", "container", "namespace"];

#[derive(Debug, Clone)]
struct PoolSpec {
    provider: usize,
    region: Option<usize>,
    zone: usize,
    egress: Option<usize>,
    tier: Option<usize>,
    price: Option<u8>,
    capacity: Option<u8>,
    standby: bool,
    memory: Option<u32>,
    vpc: Option<usize>,
}

fn pool_spec() -> impl Strategy<Value = PoolSpec> {
    (
        (
            0..5usize,
            proptest::option::of(0..3usize),
            0..4usize,
            proptest::option::of(0..4usize),
        ),
        (
            proptest::option::of(0..3usize),
            proptest::option::of(0..10u8),
            proptest::option::of(0..5u8),
        ),
        (
            proptest::bool::weighted(0.1),
            proptest::option::of(1u32..64),
            proptest::option::of(0..2usize),
        ),
    )
        .prop_map(
            |(
                (provider, region, zone, egress),
                (tier, price, capacity),
                (standby, memory, vpc),
            )| PoolSpec {
                provider,
                region,
                zone,
                egress,
                tier,
                price,
                capacity,
                standby,
                memory,
                vpc,
            },
        )
}

fn config(pools: &[PoolSpec]) -> RouterConfig {
    let providers = PROVIDERS
        .iter()
        .map(|&p| ProviderConfig {
            name: p.into(),
            kind: (p == "sim").then_some(ProviderKind::Simulated),
            capabilities: (p == "sim").then(|| CapabilitiesConfig {
                isolation: Some(vec![IsolationMode::kind("microvm")]),
                features: Some(FeaturesConfig {
                    pty: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .collect();
    let accounts = PROVIDERS
        .iter()
        .map(|&p| AccountConfig::new(format!("acct-{p}"), p))
        .collect();
    let pools = pools
        .iter()
        .enumerate()
        .map(|(i, s)| PoolConfig {
            name: format!("pool-{i:02}"),
            provider: PROVIDERS[s.provider].into(),
            account: format!("acct-{}", PROVIDERS[s.provider]),
            geography: None,
            region: s.region.map(|r| REGIONS[r].into()),
            zone: Some(ZONES[s.zone].into()),
            isolation: None,
            resources: PoolResources {
                memory_mb: s.memory.map(|m| m as u64 * 1024),
                ..Default::default()
            },
            sources: None,
            features: None,
            labels: s
                .tier
                .map(|t| [("tier".to_string(), format!("t{t}"))].into())
                .unwrap_or_default(),
            vpc: s.vpc.map(|v| format!("vpc-{v}")),
            price: s.price.map(f64::from),
            capacity: s.capacity.map(u64::from),
            egress: s.egress.map(|e| EGRESS[e]),
            standby: s.standby,
        })
        .collect();
    RouterConfig {
        providers,
        accounts,
        pools,
    }
}

fn opt_bool() -> impl Strategy<Value = Option<bool>> {
    prop_oneof![4 => Just(None), 1 => Just(Some(true)), 1 => Just(Some(false))]
}

fn request(npools: usize) -> impl Strategy<Value = Request> {
    let pr = prop_oneof![
        Just(Priority::Price),
        Just(Priority::StartupLatency),
        Just(Priority::CreationSuccess)
    ];
    (
        (
            proptest::option::of(0..5usize),
            proptest::collection::vec(0..5usize, 0..3),
            proptest::option::of(0..3usize),
            proptest::option::of(1u32..64),
            proptest::option::of(0..4usize),
        ),
        (
            opt_bool(),
            opt_bool(),
            opt_bool(),
            opt_bool(),
            opt_bool(),
            opt_bool(),
        ),
        (
            proptest::bool::weighted(0.2),
            proptest::collection::vec(0..3usize, 0..2),
            proptest::option::of(0..2usize),
            proptest::option::of(0..3usize),
        ),
        (
            proptest::collection::vec(pr, 0..3),
            proptest::option::of(0..npools.max(1)),
            proptest::option::of(1u32..3),
            proptest::option::of(proptest::collection::vec(0..6usize, 0..5)),
            proptest::bool::weighted(0.2),
        ),
    )
        .prop_map(
            |(
                (provider, fallbacks, source, memory, iso),
                (exec, read, write, ordered, pause, pty),
                (restrict, regions, vpc, tier),
                (priorities, pin, spread, order, standby),
            )| {
                let mut r = Request {
                    provider: provider.map(|p| PROVIDERS[p].into()),
                    fallback_providers: fallbacks
                        .into_iter()
                        .map(|p| PROVIDERS[p].into())
                        .collect(),
                    source: source.map(|s| match s {
                        0 => Source::Environment("metal/python".into()),
                        1 => Source::Image("python:3".into()),
                        _ => Source::Template("base".into()),
                    }),
                    regions: regions
                        .into_iter()
                        .map(|r| REGIONS[r].to_uppercase())
                        .collect(),
                    ..Default::default()
                };
                r.resources.memory_mb = memory.map(|m| m as u64 * 1024);
                r.features.isolation = iso.map(|i| IsolationMode::kind(ISOLATION[i]));
                r.features.process.execute = exec;
                r.features.filesystem.read = read;
                r.features.filesystem.write = write;
                r.features.process.ordered_output = ordered;
                r.features.pause_resume = pause;
                r.features.pty = pty;
                if restrict {
                    r.network.allow_domains = vec!["pypi.org".into()];
                }
                r.network.vpc = vpc.map(|v| format!("vpc-{v}"));
                if let Some(t) = tier {
                    r.routing
                        .pool_selector
                        .insert("tier".into(), format!("t{t}"));
                }
                r.routing.priorities = priorities;
                r.routing.pin_pool = pin.map(|p| format!("pool-{p:02}"));
                r.routing.spread = spread
                    .map(|k| {
                        vec![SpreadTerm {
                            topology: TopologyKey::Zone,
                            max_skew: k,
                            mode: SpreadMode::Hard,
                            weight: 1,
                            match_labels: BTreeMap::new(),
                        }]
                    })
                    .unwrap_or_default();
                r.routing.order = order.map(|o| {
                    Order::Providers(
                        o.into_iter()
                            .map(|i| PROVIDERS.get(i).copied().unwrap_or("standby").into())
                            .collect(),
                    )
                });
                r.routing.standby = standby;
                r
            },
        )
}

fn context(npools: usize) -> impl Strategy<Value = RouteContext> {
    (
        proptest::collection::vec(
            (
                0..npools.max(1),
                proptest::collection::vec(50.0f64..5000.0, 0..5),
                0..20u64,
                0..20u64,
            ),
            0..npools + 1,
        ),
        proptest::collection::vec((0..5usize, 0..3usize, 0..4usize), 0..12),
        proptest::collection::vec((0..npools.max(1), 0..5u64), 0..4),
    )
        .prop_map(|(stats, sandboxes, free)| RouteContext {
            stats: stats
                .into_iter()
                .map(|(p, lat, a, s)| {
                    (
                        format!("pool-{p:02}"),
                        PoolStats {
                            startup_latency_ms: lat,
                            attempts: a,
                            successes: s.min(a),
                        },
                    )
                })
                .collect(),
            sandboxes: sandboxes
                .into_iter()
                .map(|(p, r, z)| ExistingSandbox {
                    labels: BTreeMap::new(),
                    provider: PROVIDERS[p].into(),
                    region: Some(REGIONS[r].into()),
                    zone: Some(ZONES[z].into()),
                })
                .collect(),
            free_capacity: free
                .into_iter()
                .map(|(p, f)| (format!("pool-{p:02}"), f))
                .collect::<HashMap<_, _>>(),
            ..Default::default()
        })
}

fn scenario() -> impl Strategy<Value = (Vec<PoolSpec>, Request, RouteContext)> {
    proptest::collection::vec(pool_spec(), 1..14).prop_flat_map(|pools| {
        let n = pools.len();
        (Just(pools), request(n), context(n))
    })
}

fn names(r: &Result<Route, NoEligible>) -> Vec<String> {
    r.as_ref()
        .map(|r| r.candidates.iter().map(|c| c.pool.to_string()).collect())
        .unwrap_or_default()
}

/// Independent restatement of the hard requirements the generator exercises.
fn satisfies(
    t: &Topology,
    r: &Request,
    c: &RouteContext,
    cand: &Candidate,
    all: &[Candidate],
) -> Result<(), String> {
    let p = t.pool(&cand.pool).unwrap();
    let caps = &p.capabilities;
    let provider = &*cand.provider;
    // Only a named provider is exempt from the baseline; a pin keeps it (seed 001).
    let explicit = r.provider.as_deref() == Some(provider);
    let order: Option<&Vec<String>> = match &r.routing.order {
        Some(Order::Providers(v)) => Some(v),
        _ => None,
    };
    let mut fail = Vec::new();
    if let Some(pin) = &r.routing.pin_pool {
        if pin.as_str() != &*p.name {
            fail.push("pin");
        }
    }
    if p.standby {
        if !(r.routing.standby || order.is_some_and(|o| o.iter().any(|e| e == "standby"))) {
            fail.push("standby");
        }
    } else {
        if let Some(rp) = &r.provider {
            if rp != provider && !r.fallback_providers.iter().any(|f| f == provider) {
                fail.push("provider");
            }
        }
        if order.is_some_and(|o| !o.iter().any(|e| e == provider)) {
            fail.push("order");
        }
    }
    match &r.source {
        Some(Source::Environment(e)) if !caps.environments.contains(e) => fail.push("env"),
        Some(Source::Image(_)) if !caps.image => fail.push("image"),
        Some(Source::Template(_)) if !caps.template => fail.push("template"),
        _ => {}
    }
    if let Some(m) = r.resources.memory_mb {
        if p.resources.memory_mb.is_none_or(|l| m > l) {
            fail.push("memory");
        }
    }
    if let Some(iso) = &r.features.isolation {
        if !caps
            .isolation
            .iter()
            .any(|m| m.0.get("kind") == iso.0.get("kind"))
        {
            fail.push("isolation");
        }
    }
    let f = &r.features;
    if f.process.execute.unwrap_or(!explicit) && !caps.process.execute {
        fail.push("execute");
    }
    if f.filesystem.read.unwrap_or(!explicit) && !caps.filesystem.read {
        fail.push("read");
    }
    if f.filesystem.write.unwrap_or(!explicit) && !caps.filesystem.write {
        fail.push("write");
    }
    if f.process.ordered_output == Some(true) && !caps.process.ordered_output {
        fail.push("ordered");
    }
    if f.pause_resume == Some(true) && !caps.pause_resume {
        fail.push("pause");
    }
    if f.pty == Some(true) && !caps.pty {
        fail.push("pty");
    }
    if r.network.restricts_egress()
        && !matches!(
            caps.egress,
            EgressEnforcement::Native | EgressEnforcement::Gateway
        )
    {
        fail.push("egress");
    }
    if r.network.vpc.is_some() && r.network.vpc != p.vpc {
        fail.push("vpc");
    }
    if !r.regions.is_empty()
        && !r
            .regions
            .iter()
            .any(|x| Some(x.to_lowercase().as_str()) == p.region.as_deref())
    {
        fail.push("regions");
    }
    if let Some(tier) = r.routing.pool_selector.get("tier") {
        if p.labels.get("tier") != Some(tier) {
            fail.push("selector");
        }
    }
    for s in &r.routing.spread {
        let count = |z: &str| {
            c.sandboxes
                .iter()
                .filter(|s| s.zone.as_deref() == Some(z))
                .count() as i64
        };
        let min = all
            .iter()
            .map(|a| count(a.zone.as_deref().unwrap()))
            .min()
            .unwrap();
        if count(p.zone.as_deref().unwrap()) + 1 - min > s.max_skew as i64 {
            fail.push("spread");
        }
    }
    if fail.is_empty() {
        Ok(())
    } else {
        Err(format!("{} violates {fail:?}", p.name))
    }
}

proptest! {
    // Regressions live beside this file (properties.proptest-regressions). The default,
    // `SourceParallel`, would look beside the directory holding `main.rs` instead.
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_candidate_satisfies_every_hard_requirement((pools, r, c) in scenario()) {
        let t = config(&pools).compile().unwrap();
        match route(&t, &r, &c) {
            Ok(route) => {
                prop_assert!(!route.candidates.is_empty());
                for cand in &route.candidates {
                    if let Err(e) = satisfies(&t, &r, &c, cand, &route.candidates) {
                        prop_assert!(false, "{}", e);
                    }
                }
            }
            Err(e) => {
                prop_assert_eq!(e.code.as_str(), NO_ELIGIBLE_PROVIDER);
                // Every pool is explained, or only the pinned one when it exists.
                let pinned = r.routing.pin_pool.as_deref().filter(|p| t.pool(p).is_some());
                let expected = if pinned.is_some() { 1 } else { pools.len() };
                prop_assert_eq!(e.details.attempts.len(), expected);
                prop_assert!(e.details.attempts.iter().all(|a| !a.unmet_requirements.is_empty()));
            }
        }
    }

    #[test]
    fn order_is_deterministic_for_equal_inputs((pools, r, c) in scenario()) {
        let t1 = config(&pools).compile().unwrap();
        let t2 = config(&pools).compile().unwrap();
        let a = route(&t1, &r, &c);
        let b = route(&t2, &r.clone(), &c.clone());
        prop_assert_eq!(&a, &b);
        let x = explain(&t1, &r, &c);
        prop_assert_eq!(x.order.iter().map(|p| p.to_string()).collect::<Vec<_>>(), names(&a));
        // One evaluation gives both: the route is `route`'s and the record is `explain`'s.
        let (both, record) = sandgate_router::route_explained(&t1, &r, &c);
        prop_assert_eq!(&both, &a);
        prop_assert_eq!(&record, &x);
        // The create path's record: the same route, every candidate explained as `explain`
        // does, and at most the limit of ineligible pools (their reasons among explain's).
        let (recorded_route, rec) = sandgate_router::route_recorded(&t1, &r, &c, 3);
        prop_assert_eq!(&recorded_route, &a);
        if a.is_err() {
            prop_assert_eq!(&rec, &x);
        } else {
            prop_assert_eq!(&rec.order, &x.order);
            let full = |name: &str| x.pools.iter().find(|q| *q.pool == *name).unwrap();
            for p in rec.pools.iter().filter(|p| p.eligible) {
                prop_assert_eq!(p, full(&p.pool));
            }
            let shown = rec.pools.iter().filter(|p| !p.eligible).count();
            let ineligible = x.pools.iter().filter(|p| !p.eligible).count();
            prop_assert_eq!(shown, ineligible.min(3));
            prop_assert_eq!(rec.ineligible_omitted, ineligible - shown);
            for p in rec.pools.iter().filter(|p| !p.eligible) {
                let theirs = &full(&p.pool).unmet_requirements;
                prop_assert!(!p.unmet_requirements.is_empty());
                for u in &p.unmet_requirements {
                    prop_assert!(
                        theirs.contains(u)
                            || (u == "routing.spread" && theirs.iter().all(|t| t.starts_with("routing.spread"))),
                        "{} {:?} vs {:?}", p.pool, p.unmet_requirements, theirs
                    );
                }
            }
        }
    }

    #[test]
    fn pinned_pool_yields_at_most_one_candidate((pools, mut r, c) in scenario(), pin in 0..20usize) {
        let t = config(&pools).compile().unwrap();
        let name = format!("pool-{pin:02}");
        r.routing.pin_pool = Some(name.clone());
        let got = names(&route(&t, &r, &c));
        prop_assert!(got.len() <= 1);
        if let Some(p) = got.first() {
            prop_assert_eq!(p, &name);
        }
    }

    #[test]
    fn adding_a_preference_never_adds_a_candidate(
        (pools, r, c) in scenario(),
        extra in proptest::collection::vec(0..3usize, 1..3),
        weight in 1u32..50,
    ) {
        let t = config(&pools).compile().unwrap();
        let before = names(&route(&t, &r, &c));
        let mut r2 = r.clone();
        for e in extra {
            match e {
                0 => r2.routing.priorities.push(Priority::CreationSuccess),
                1 => r2.routing.pool_affinity.preferred.push(WeightedLabelExpr {
                    weight, key: "tier".into(), operator: Operator::In, values: vec!["t1".into()],
                }),
                _ => r2.routing.spread.push(SpreadTerm {
                    topology: TopologyKey::Region, max_skew: 1, mode: SpreadMode::Soft, weight, match_labels: BTreeMap::new(),
                }),
            }
        }
        let after = names(&route(&t, &r2, &c));
        for p in &after {
            prop_assert!(before.contains(p), "{} added by a preference", p);
        }
    }

    #[test]
    fn removing_a_pool_never_reorders_the_others((pools, r, c) in scenario(), drop in 0..14usize) {
        prop_assume!(pools.len() > 1);
        let drop = drop % pools.len();
        let t = config(&pools).compile().unwrap();
        let before = names(&route(&t, &r, &c));
        let mut cfg = config(&pools);
        let dropped = cfg.pools.remove(drop).name;
        let t2 = cfg.compile().unwrap();
        let after = names(&route(&t2, &r, &c));
        let common: Vec<&String> = before.iter().filter(|p| **p != dropped && after.contains(p)).collect();
        let after_common: Vec<&String> = after.iter().filter(|p| before.contains(p)).collect();
        prop_assert_eq!(common, after_common);
        if r.routing.spread.is_empty() {
            // Without hard spread the surviving set is exactly the old one minus the dropped pool.
            let expect: Vec<&String> = before.iter().filter(|p| **p != dropped).collect();
            prop_assert_eq!(expect, after.iter().collect::<Vec<_>>());
        }
    }
}
