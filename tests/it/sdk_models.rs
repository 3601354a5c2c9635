//! The SDKs' model types (`sdk/python/sandgate/schema.py`, `sdk/typescript/src/schema.ts`) are
//! what `sdk/tools/gen_models.py` generates from the OpenAPI document a running gateway
//! serves: a change to the API's schemas that is not regenerated into the SDKs fails here,
//! with the diff. (Regenerate: save `GET /openapi.json` and run
//! `python3 sdk/tools/gen_models.py openapi.json`.)

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_models_match_the_served_openapi_document() {
    let gw = Gateway::start(GatewayOptions::default()).await;
    let document = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(gw.api("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let path = gw.dir.path().join("openapi.json");
    std::fs::write(&path, document).unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = tokio::process::Command::new("python3")
        .arg(repo.join("sdk/tools/gen_models.py"))
        .arg(&path)
        .arg("--check")
        .output()
        .await
        .expect("python3 runs (the model check needs it)");
    if !output.status.success() {
        // The served document, kept where the regeneration can read it.
        let kept = std::env::temp_dir().join("sandgate-openapi.json");
        std::fs::copy(&path, &kept).unwrap();
        panic!(
            "the SDK models differ from the served OpenAPI document:\n{}{}\n\
             regenerate: python3 sdk/tools/gen_models.py {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            kept.display()
        );
    }
}
