//! The TypeScript SDK (`sdk/typescript`, `@sandgate/sdk`) against a real gateway with local
//! sandboxes: `sdk/typescript/scenarios/scenarios.test.mjs` run with `node --test`. The
//! package is compiled first from the work tree's sources with the TypeScript compiler
//! `sdk/check.sh` installs (`npm ci`), so the scenarios test this commit's code. Without
//! node or the compiler the test fails: CI must not pass without running the suite.

use crate::common::own_sdk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_typescript_scenarios_pass_against_a_real_gateway() {
    let Some(env) = own_sdk::start("sdk_typescript::scenarios", "sgts-").await else {
        return;
    };
    let package = own_sdk::repo().join("sdk/typescript");
    let tsc = package.join("node_modules/typescript/bin/tsc");
    assert!(
        tsc.is_file(),
        "{} is missing: run sdk/check.sh (npm ci in sdk/typescript) first",
        tsc.display()
    );
    let build = tokio::process::Command::new("node")
        .arg(&tsc)
        .args(["-p", "tsconfig.json"])
        .current_dir(&package)
        .output()
        .await
        .expect("node runs (Node 20+ is needed for the TypeScript SDK)");
    assert!(
        build.status.success(),
        "the TypeScript SDK does not compile:\n{}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    let mut command = tokio::process::Command::new("node");
    command.args(["--test", "sdk/typescript/scenarios/scenarios.test.mjs"]);
    own_sdk::run(&env, command, "the TypeScript SDK scenarios").await;
}
