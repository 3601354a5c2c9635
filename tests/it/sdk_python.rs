//! The Python SDK (`sdk/python`, package `sandgate`) against a real gateway with local
//! sandboxes: `sdk/python/scenarios/test_scenarios.py` run with pytest from the venv
//! `sdk/check.sh` installs (`/opt/sandgate-pysdk-venv`, or `SANDGATE_PYSDK_VENV`). The SDK
//! is imported from the work tree, so the scenarios test this commit's code. Without the venv
//! or its packages the test fails: CI must not pass without running the suite.

use crate::common::own_sdk;

fn python() -> std::path::PathBuf {
    let venv = std::env::var_os("SANDGATE_PYSDK_VENV")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/opt/sandgate-pysdk-venv".into());
    venv.join("bin/python")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_python_scenarios_pass_against_a_real_gateway() {
    let Some(env) = own_sdk::start("sdk_python::scenarios", "sgpy-").await else {
        return;
    };
    let python = python();
    let probe = std::process::Command::new(&python)
        .args(["-c", "import httpx, pytest"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "{} cannot import httpx and pytest ({}): run sdk/check.sh, which installs \
             sdk/python/requirements-test.txt into it",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!(
            "{} does not run ({e}): run sdk/check.sh, which creates the venv",
            python.display()
        ),
    }
    let mut command = tokio::process::Command::new(&python);
    command
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "sdk/python/scenarios",
        ])
        .env("PYTHONPATH", own_sdk::repo().join("sdk/python"));
    own_sdk::run(&env, command, "the Python SDK scenarios").await;
}
