//! Cloud metadata endpoints through the real proxy: a name that resolves to one is refused
//! with `destination_forbidden` before anything is dialed, whatever the policy allows and
//! whatever `[egress] allow_private` exempts.

use std::time::{Duration, Instant};

use crate::common::*;

/// Names the identity may reach (the policy allows them all), each resolving to a metadata
/// endpoint.
const HOSTS: &[(&str, &str)] = &[
    ("wire.test", "168.63.129.16"),   // Azure WireServer: a public address
    ("imds.test", "169.254.169.254"), // AWS, GCP, Azure, OCI, ... IMDS
    ("ecs.test", "169.254.170.2"),    // AWS ECS task credentials
    ("pod.test", "169.254.170.23"),   // AWS EKS Pod Identity
    ("oracle.test", "192.0.0.192"),   // Oracle Cloud Classic
    ("aliyun.test", "100.100.100.200"), // Alibaba Cloud
    ("imds6.test", "fd00:ec2::254"),  // AWS IMDS over IPv6
    ("mapped.test", "::ffff:168.63.129.16"), // v4-mapped form of the WireServer
];

async fn gateway(extra_toml: &str) -> Gateway {
    let names: Vec<&'static str> = HOSTS.iter().map(|(name, _)| *name).collect();
    Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec::new("sb-m", "ws-m", names)],
        hosts: HOSTS.to_vec(),
        extra_toml: extra_toml.to_string(),
        ..Default::default()
    })
    .await
}

/// CONNECT and a plain-HTTP proxy request to every metadata name: each is a quick 403
/// `destination_forbidden` naming the address, and its decision record says so.
async fn assert_every_metadata_name_is_refused(gw: &Gateway) {
    for (name, ip) in HOSTS {
        let started = Instant::now();
        let err = connect_tunnel(
            gw.server.proxy_addr(),
            &format!("{name}:80"),
            Some(("sb-m", TOKEN)),
        )
        .await
        .expect_err(name);
        assert_eq!(err.0, 403, "{name}: {}", err.1);
        assert!(err.1.contains("destination_forbidden"), "{name}: {}", err.1);
        let shown: std::net::IpAddr = ip.parse().unwrap();
        assert!(
            err.1.contains(&shown.to_string()),
            "{name}: the refusal names {ip}: {}",
            err.1
        );
        // Refused before dialing: a dial to an unreachable address would take the
        // connect timeout, and answer 502/504.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{name} took {:?}",
            started.elapsed()
        );

        let response = gw
            .client("sb-m", true)
            .get(format!("http://{name}/latest/meta-data/"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{name}");
        assert_eq!(
            response.headers()["x-sandgate-error"],
            "destination_forbidden",
            "{name}"
        );
    }
    let records = gw.decisions(2 * HOSTS.len()).await;
    for (name, _) in HOSTS {
        let mine: Vec<_> = records.iter().filter(|r| r["host"] == *name).collect();
        assert_eq!(mine.len(), 2, "{name}: {records:?}");
        for record in mine {
            assert_eq!(record["decision"], "deny", "{record}");
            assert_eq!(record["code"], "destination_forbidden", "{record}");
        }
    }
}

#[tokio::test]
async fn metadata_addresses_are_refused_when_policy_allows_the_name() {
    init();
    let gw = gateway("").await;
    assert_every_metadata_name_is_refused(&gw).await;
    gw.server.shutdown();
}

#[tokio::test]
async fn no_allow_private_range_exempts_a_metadata_address() {
    init();
    // The broadest exemptions there are, and exact listings of the addresses themselves.
    let gw = gateway(
        "[egress]\nallow_private = [\"0.0.0.0/0\", \"::/0\", \"169.254.0.0/16\", \
         \"168.63.129.16/32\", \"169.254.169.254/32\", \"fd00:ec2::254/128\"]\n",
    )
    .await;
    assert_every_metadata_name_is_refused(&gw).await;
    gw.server.shutdown();
}
