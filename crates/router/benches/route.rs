//! Routes a complex request over 10,000 pools with 1,000 existing sandboxes and prints median and
//! p99, next to a baseline measured in the same run: the hard-requirement filter pass alone over
//! the same pools (no ranking, ordering or candidate construction).
//!
//! `CARGO_TARGET_DIR=/tmp/router-target cargo bench` (release profile). Target: median < 2 ms.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use sandgate_router::*;

const POOLS: usize = 10_000;
const SANDBOXES: usize = 1_000;
const WARMUP: usize = 30;
const ITERS: usize = 200;

const PROVIDERS: [&str; 13] = [
    "e2b",
    "daytona",
    "modal",
    "vercel",
    "cloudflare",
    "runloop",
    "codesandbox",
    "northflank",
    "blaxel",
    "freestyle",
    "prime-intellect",
    "local",
    "simulated",
];
const REGIONS: [&str; 12] = [
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
    "eu-west-1",
    "eu-west-2",
    "eu-central-1",
    "ap-south-1",
    "ap-northeast-1",
    "ap-southeast-1",
    "sa-east-1",
    "ca-central-1",
];

/// Deterministic xorshift so runs are comparable.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn topology(rng: &mut Rng) -> Topology {
    let providers = PROVIDERS
        .iter()
        .map(|&p| ProviderConfig {
            name: p.into(),
            kind: None,
            capabilities: None,
        })
        .collect();
    let accounts = PROVIDERS
        .iter()
        .flat_map(|&p| {
            (0..3).map(move |a| AccountConfig {
                credential: Some(format!("env:{}_{a}", p.to_uppercase())),
                labels: [("team".to_string(), format!("team-{a}"))].into(),
                ..AccountConfig::new(format!("{p}-acct-{a}"), p)
            })
        })
        .collect();
    let egress = [
        EgressEnforcement::Native,
        EgressEnforcement::Gateway,
        EgressEnforcement::Advisory,
        EgressEnforcement::None,
    ];
    let tiers = ["gold", "silver", "bronze"];
    let compliance = ["soc2", "hipaa", "none"];
    let pools = (0..POOLS)
        .map(|i| {
            let p = PROVIDERS[rng.below(PROVIDERS.len())];
            let region = REGIONS[rng.below(REGIONS.len())];
            let mut labels = BTreeMap::new();
            labels.insert("tier".to_string(), tiers[rng.below(3)].to_string());
            labels.insert(
                "compliance".to_string(),
                compliance[rng.below(3)].to_string(),
            );
            labels.insert("gen".to_string(), format!("{}", 2 + rng.below(3)));
            PoolConfig {
                name: format!("{p}-{region}-{i:05}"),
                provider: p.into(),
                account: format!("{p}-acct-{}", rng.below(3)),
                geography: Some(region[..2].to_string()),
                region: Some(region.into()),
                zone: Some(format!("{region}{}", ["a", "b", "c"][rng.below(3)])),
                isolation: None,
                resources: PoolResources {
                    cpu: Some([2.0, 4.0, 8.0, 16.0][rng.below(4)]),
                    memory_mb: Some([2048, 4096, 8192, 32768][rng.below(4)]),
                    disk_gb: Some(100),
                    pids: None,
                    gpu: None,
                    gpu_types: vec![],
                },
                sources: None,
                features: None,
                labels,
                vpc: None,
                price: (rng.below(10) != 0).then(|| (rng.below(1000) as f64) / 100.0),
                capacity: Some(rng.below(100) as u64),
                egress: Some(egress[rng.below(4)]),
                standby: false,
            }
        })
        .collect();
    RouterConfig {
        providers,
        accounts,
        pools,
    }
    .compile()
    .expect("valid config")
}

fn context(rng: &mut Rng, topo: &Topology) -> RouteContext {
    let mut ctx = RouteContext::default();
    for p in topo.pools() {
        if rng.below(8) != 0 {
            let samples = (0..20).map(|_| 200.0 + rng.below(3000) as f64).collect();
            let attempts = 20 + rng.below(200) as u64;
            let successes = attempts - rng.below(20) as u64;
            ctx.stats.insert(
                p.name.to_string(),
                PoolStats {
                    startup_latency_ms: samples,
                    attempts,
                    successes,
                },
            );
        }
        if rng.below(2) == 0 {
            ctx.free_capacity
                .insert(p.name.to_string(), rng.below(50) as u64);
        }
    }
    let apps = ["web", "db", "crawl", "batch"];
    for _ in 0..SANDBOXES {
        let p = &topo.pools()[rng.below(POOLS)];
        let mut labels = BTreeMap::new();
        labels.insert("app".to_string(), apps[rng.below(4)].to_string());
        labels.insert("job".to_string(), format!("j{}", rng.below(5)));
        ctx.sandboxes.push(ExistingSandbox {
            labels,
            provider: topo.providers()[p.provider].name.to_string(),
            region: p.region.as_deref().map(str::to_string),
            zone: p.zone.as_deref().map(str::to_string),
        });
    }
    ctx
}

fn request() -> Request {
    serde_json::from_value(serde_json::json!({
        "fallback_providers": ["e2b"],
        "source": {"environment": "metal/python"},
        "resources": {"cpu": 2, "memory_mb": 4096},
        "features": {"isolation": "microvm", "process": {"execute": true}},
        "network": {"allow_domains": ["pypi.org", "github.com"]},
        "regions": ["us-east-1", "us-west-2", "eu-west-1", "ap-south-1"],
        "labels": {"app": "web", "job": "j1"},
        "routing": {
            "priorities": ["startup_latency", "creation_success", "price"],
            "pool_selector": {"compliance": "soc2"},
            "pool_affinity": {
                "required": [{"key": "tier", "operator": "not_in", "values": ["bronze"]}],
                "preferred": [{"weight": 10, "key": "gen", "values": ["4"]},
                              {"weight": 5, "key": "account.team", "values": ["team-1"]}]
            },
            "sandbox_affinity": {"preferred": [{"weight": 3, "topology": "region", "match_labels": {"app": "db"}}]},
            "sandbox_anti_affinity": {"preferred": [{"weight": 7, "topology": "zone", "match_labels": {"app": "web"}}]},
            "spread": [
                {"topology": "zone", "max_skew": 4, "match_labels": {"job": "j1"}},
                {"topology": "provider", "mode": "soft", "match_labels": {"app": "web"}}
            ]
        }
    }))
    .expect("request")
}

fn measure(mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..WARMUP {
        f();
    }
    let mut v: Vec<Duration> = (0..ITERS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn broad_request() -> Request {
    serde_json::from_value(serde_json::json!({
        "labels": {"app": "web"},
        "routing": {
            "priorities": ["price", "startup_latency", "creation_success"],
            "pool_affinity": {"preferred": [{"weight": 10, "key": "gen", "values": ["4"]}]},
            "sandbox_anti_affinity": {"preferred": [{"weight": 7, "topology": "zone", "match_labels": {"app": "web"}}]},
            "spread": [{"topology": "region", "mode": "soft", "match_labels": {"app": "web"}}]
        }
    }))
    .expect("request")
}

fn run(name: &str, topo: &Topology, req: &Request, ctx: &RouteContext) -> f64 {
    let r = route(topo, req, ctx).expect("some pool qualifies");
    assert_eq!(filter_only(topo, req, ctx), r.candidates.len());
    println!(
        "[{name}] {} pools, {} existing sandboxes, {} eligible candidates, first {} ({} iterations after {} warm-up)",
        POOLS,
        SANDBOXES,
        r.candidates.len(),
        r.candidates[0].pool,
        ITERS,
        WARMUP
    );
    let full = measure(|| {
        black_box(route(black_box(topo), black_box(req), black_box(ctx)).unwrap());
    });
    let base = measure(|| {
        black_box(filter_only(black_box(topo), black_box(req), black_box(ctx)));
    });
    // What the create engine runs: the route and its placement record from one evaluation.
    let recorded = measure(|| {
        let _ = black_box(route_recorded(
            black_box(topo),
            black_box(req),
            black_box(ctx),
            16,
        ));
    });
    let p = |v: &[Duration], q: f64| v[((v.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    let (rm, r99) = (p(&recorded, 0.5), p(&recorded, 0.99));
    let (fm, f99) = (p(&full, 0.5), p(&full, 0.99));
    let (bm, b99) = (p(&base, 0.5), p(&base, 0.99));
    println!(
        "[{name}] route (filter+rank+place): median {:.3} ms  p99 {:.3} ms",
        ms(fm),
        ms(f99)
    );
    println!(
        "[{name}] baseline (filter only):    median {:.3} ms  p99 {:.3} ms",
        ms(bm),
        ms(b99)
    );
    println!(
        "[{name}] ratio route/baseline:      median {:.2}x  p99 {:.2}x",
        ms(fm) / ms(bm),
        ms(f99) / ms(b99)
    );
    println!(
        "[{name}] route + record (create):   median {:.3} ms  p99 {:.3} ms  ({:.2}x route)",
        ms(rm),
        ms(r99),
        ms(rm) / ms(fm)
    );
    ms(fm)
}

fn main() {
    let mut rng = Rng(0x5eed_5a4d_6a7e);
    let topo = topology(&mut rng);
    let ctx = context(&mut rng, &topo);
    let complex = run("complex", &topo, &request(), &ctx);
    println!(
        "target median < 2 ms (complex request): {}",
        if complex < 2.0 { "met" } else { "MISSED" }
    );
    run("broad", &topo, &broad_request(), &ctx);
}
