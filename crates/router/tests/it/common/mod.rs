#![allow(dead_code)]

use sandgate_router::{route, NoEligible, Request, Route, RouteContext, RouterConfig, Topology};
use serde_json::Value;

/// The managed providers of seed 000, in the order the seed lists them.
pub const MANAGED: [&str; 11] = [
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
];

pub fn topo(src: &str) -> Topology {
    let cfg: RouterConfig = toml::from_str(src).unwrap_or_else(|e| panic!("toml: {e}"));
    cfg.compile().unwrap_or_else(|e| panic!("config: {e}"))
}

/// `[[providers]]`, an account and one roomy pool (`<name>-1`, us-east-1) per provider name.
pub fn providers_toml(names: &[&str]) -> String {
    let mut s = String::new();
    for n in names {
        s += &format!("[[providers]]\nname = \"{n}\"\n\n");
    }
    for n in names {
        s += &format!("[[accounts]]\nname = \"acct-{n}\"\nprovider = \"{n}\"\n\n");
    }
    for n in names {
        s += &pool_toml(&format!("{n}-1"), n, "");
    }
    s
}

/// One pool on `acct-<provider>`. Defaults (region us-east-1, a roomy `[pools.resources]`) are
/// added unless `extra` sets them; `extra` containing `#noregion` leaves the region undeclared.
pub fn pool_toml(name: &str, provider: &str, extra: &str) -> String {
    let region = if extra.contains("region =") || extra.contains("#noregion") {
        ""
    } else {
        "region = \"us-east-1\"\n"
    };
    let resources = if extra.contains("[pools.resources]") {
        ""
    } else {
        "[pools.resources]\ncpu = 16\nmemory_mb = 65536\ndisk_gb = 500\n"
    };
    format!("[[pools]]\nname = \"{name}\"\nprovider = \"{provider}\"\naccount = \"acct-{provider}\"\n{region}{extra}\n{resources}\n")
}

pub fn managed() -> Topology {
    topo(&providers_toml(&MANAGED))
}

pub fn req(v: Value) -> Request {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("request: {e}"))
}

pub fn ctx() -> RouteContext {
    RouteContext::default()
}

pub fn pools(r: &Route) -> Vec<String> {
    r.candidates.iter().map(|c| c.pool.to_string()).collect()
}

pub fn providers(r: &Route) -> Vec<String> {
    r.candidates
        .iter()
        .map(|c| c.provider.to_string())
        .collect()
}

pub fn route_pools(t: &Topology, r: &Request, c: &RouteContext) -> Vec<String> {
    match route(t, r, c) {
        Ok(r) => pools(&r),
        Err(_) => vec![],
    }
}

pub fn route_providers(t: &Topology, r: &Request) -> Vec<String> {
    match route(t, r, &ctx()) {
        Ok(r) => providers(&r),
        Err(_) => vec![],
    }
}

pub fn no_eligible(t: &Topology, r: &Request, c: &RouteContext) -> NoEligible {
    match route(t, r, c) {
        Ok(r) => panic!("expected no_eligible_provider, got {:?}", pools(&r)),
        Err(e) => e,
    }
}

/// Unmet requirements recorded for `pool`.
pub fn unmet_for(e: &NoEligible, pool: &str) -> Vec<String> {
    e.details
        .attempts
        .iter()
        .find(|a| a.pool == pool)
        .unwrap_or_else(|| panic!("no attempt for {pool}"))
        .unmet_requirements
        .clone()
}

pub fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

pub fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Baseline opted out, so only the named requirement decides.
pub fn no_baseline(mut v: Value) -> Value {
    let f = v
        .as_object_mut()
        .unwrap()
        .entry("features")
        .or_insert(serde_json::json!({}));
    let f = f.as_object_mut().unwrap();
    let p = f.entry("process").or_insert(serde_json::json!({}));
    p.as_object_mut()
        .unwrap()
        .entry("execute")
        .or_insert(Value::Bool(false));
    let fs = f.entry("filesystem").or_insert(serde_json::json!({}));
    let fs = fs.as_object_mut().unwrap();
    fs.entry("read").or_insert(Value::Bool(false));
    fs.entry("write").or_insert(Value::Bool(false));
    v
}
