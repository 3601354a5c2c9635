//! `explain`: every pool with eligibility, unmet requirements, rank keys, bands and final order.

use crate::common::*;
use sandgate_router::{explain, route, PoolStats};
use serde_json::json;

#[test]
fn explanation_covers_every_pool_and_matches_route() {
    let mut s = providers_toml(&["e2b", "modal", "northflank"]);
    s = s.replace("name = \"e2b-1\"\n", "name = \"e2b-1\"\nprice = 2.0\n");
    s = s.replace("name = \"modal-1\"\n", "name = \"modal-1\"\nprice = 1.0\n");
    let t = topo(&s);
    let mut c = ctx();
    c.stats.insert(
        "e2b-1".into(),
        PoolStats {
            startup_latency_ms: vec![300.0, 700.0, 500.0],
            attempts: 10,
            successes: 9,
        },
    );
    c.free_capacity.insert("modal-1".into(), 3);
    let r = req(json!({"routing": {"priorities": ["startup_latency", "price"]}}));
    let x = explain(&t, &r, &c);
    let routed = route(&t, &r, &c).unwrap();
    assert_eq!(
        x.order.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        pools(&routed)
    );
    assert_eq!(x.pools.len(), 3);
    let v = serde_json::to_value(&x).unwrap();
    assert_eq!(v["automatic"], true);
    assert_eq!(v["priorities"], json!(["startup_latency", "price"]));
    assert_eq!(v["order"], json!(["e2b-1", "modal-1"]));
    let e2b = &v["pools"][0];
    assert_eq!(e2b["pool"], "e2b-1");
    assert_eq!(e2b["eligible"], true);
    assert_eq!(e2b["position"], 0);
    assert_eq!(
        e2b["rank"][0],
        json!({"priority": "startup_latency", "value": 500.0, "band": 2})
    );
    assert_eq!(
        e2b["rank"][1],
        json!({"priority": "price", "value": 2.0, "band": null})
    );
    assert_eq!(e2b["metrics"]["startup_latency_samples"], 3);
    assert_eq!(e2b["metrics"]["creation_success"], 0.9);
    let nf = &v["pools"][2];
    assert_eq!(nf["eligible"], false);
    assert_eq!(nf["position"], serde_json::Value::Null);
    assert_eq!(
        nf["unmet_requirements"],
        json!([
            "features.process.execute",
            "features.filesystem.read",
            "features.filesystem.write"
        ])
    );
    assert_eq!(v["pools"][1]["free_capacity"], 3);
    assert_eq!(v["error"], serde_json::Value::Null);
}

#[test]
fn explanation_carries_the_error_when_nothing_qualifies() {
    let t = topo(&providers_toml(&["e2b"]));
    let r = req(json!({"regions": ["eu-west-1"]}));
    let x = explain(&t, &r, &ctx());
    assert!(x.order.is_empty());
    let err = x.error.expect("error");
    assert_eq!(err, route(&t, &r, &ctx()).unwrap_err());
    assert_eq!(
        err.details.attempts[0].unmet_requirements,
        vec!["regions".to_string()]
    );
}
