// Drives the official @northflank/js-client against the fake Northflank API
// (tests/it/common/fakes/northflank.rs); run by
// tests/it/northflank_fake.rs::official_js_sdk_accepts_the_fake.
//
// Environment: NORTHFLANK_FAKE_URL (the fake's origin, the client context's `host`),
// NORTHFLANK_TOKEN, NORTHFLANK_PROJECT, NORTHFLANK_TEAM, SANDGATE_SDK_NODE (the directory whose
// node_modules holds the client, default /opt/sandgate-sdk-node), NORTHFLANK_SDK_EXPECTED_VERSION.
// The client takes its host from the context (ApiClientInMemoryContextProvider), so it talks
// to the fake as it would to https://api.northflank.com. Exec and file copy (a WebSocket at
// /v1/command-exec/...) are not driven: the fake, like the adapter, does not implement them.
// Prints `CONTRACT OK {json}` last on success; any failure throws (non-zero exit).

import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";
import assert from "node:assert/strict";

const sdkDir = process.env.SANDGATE_SDK_NODE || "/opt/sandgate-sdk-node";
const require = createRequire(path.join(sdkDir, "package.json"));
// The package's own CommonJS entry (its `exports` has no `./package.json`, so the version is
// read from the file).
const { ApiClient, ApiClientInMemoryContextProvider, NorthflankApiCallError } =
  require("@northflank/js-client");
const pkg = JSON.parse(
  readFileSync(path.join(sdkDir, "node_modules/@northflank/js-client/package.json"), "utf8"),
);

const expected = process.env.NORTHFLANK_SDK_EXPECTED_VERSION;
if (expected) assert.equal(pkg.version, expected, "the pinned @northflank/js-client version");

const host = process.env.NORTHFLANK_FAKE_URL.replace(/\/$/, "");
const projectId = process.env.NORTHFLANK_PROJECT;
const teamId = process.env.NORTHFLANK_TEAM;
const run = `r${Date.now().toString(36)}`;

async function client(token) {
  const context = new ApiClientInMemoryContextProvider();
  await context.addContext({ name: "fake", token, host });
  return new ApiClient(context, { throwErrorOnHttpErrorCode: true });
}
const api = await client(process.env.NORTHFLANK_TOKEN);

async function refused(call) {
  try {
    await call();
  } catch (e) {
    assert.ok(e instanceof NorthflankApiCallError, `a NorthflankApiCallError, got ${e}`);
    return e;
  }
  assert.fail("the call was not refused");
}

async function deployed(parameters) {
  const until = Date.now() + 20000;
  for (;;) {
    const { data } = await api.get.service({ parameters });
    if (data.status?.deployment?.status === "COMPLETED") return data;
    assert.notEqual(data.status?.deployment?.status, "FAILED");
    assert.ok(Date.now() < until, `still ${JSON.stringify(data.status)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// The project the services live in.
const project = await api.get.project({ parameters: { projectId } });
assert.equal(project.data.id, projectId);

// Create (create-or-update, as the adapter does), tagged in the description.
const description = `sandgate_sandbox=sb-contract sandgate_attempt=sb-contract-${run}`;
const body = {
  name: `sg-contract-${run}`,
  description,
  billing: { deploymentPlan: "nf-compute-20" },
  deployment: {
    instances: 1,
    external: { imagePath: "ubuntu:24.04" },
    docker: { configType: "customCommand", customCommand: "sleep infinity" },
  },
  runtimeEnvironment: { CONTRACT_ENV: run },
  runtimeFiles: {
    "/etc/sandgate/ca.pem": {
      data: Buffer.from(`CA for ${run}\n`).toString("base64"),
      encoding: "utf-8",
    },
  },
};
const created = await api.put.service.deployment({ parameters: { projectId }, data: body });
const id = created.data.id;
assert.equal(id, `sg-contract-${run}`);
assert.equal(created.data.description, description);

// The same name again through POST is refused as a duplicate, with Northflank's error body.
const duplicate = await refused(() =>
  api.create.service.deployment({ parameters: { projectId }, data: body }),
);
assert.equal(duplicate.status, 409);
assert.ok(duplicate.message.length > 0);

const service = { projectId, serviceId: id };
const ready = await deployed(service);
assert.equal(ready.servicePaused, false);
assert.equal(ready.deployment.instances, 1);
assert.equal(ready.deployment.external.imagePath, "ubuntu:24.04");
assert.equal(ready.billing.deploymentPlan, "nf-compute-20");

// A second service, so the listing takes two pages of one.
const other = await api.create.service.deployment({
  parameters: { teamId, projectId },
  data: { ...body, name: `sg-other-${run}`, description: "not sandgate's" },
});
const listed = await api.list.services.all({ parameters: { projectId }, options: { per_page: 1 } });
const ids = listed.data.services.map((s) => s.id);
assert.ok(ids.includes(id) && ids.includes(other.data.id), `listed ${ids}`);
assert.equal(listed.data.services.find((s) => s.id === id).description, description);

// Pause (scale to 0), resume, scale.
await api.pause.service({ parameters: service });
const paused = await api.get.service({ parameters: service });
assert.equal(paused.data.servicePaused, true);
assert.equal(paused.data.deployment.instances, 0);
const again = await refused(() => api.pause.service({ parameters: service }));
assert.equal(again.status, 409);
await api.resume.service({ parameters: service, data: { instances: 1 } });
const resumed = await deployed(service);
assert.equal(resumed.servicePaused, false);
await api.scale.service({ parameters: service, data: { instances: 1 } });

// A wrong token is refused.
const stranger = await client("nf_wrong_token");
const denied = await refused(() => stranger.get.service({ parameters: service }));
assert.equal(denied.status, 401);

// Delete; then it is gone.
await api.delete.service({ parameters: { projectId, serviceId: other.data.id } });
await api.delete.service({ parameters: service });
const gone = await refused(() => api.get.service({ parameters: service }));
assert.equal(gone.status, 404);

console.log(
  "CONTRACT OK " +
    JSON.stringify({
      sdk: pkg.version,
      service: id,
      other: other.data.id,
      run,
      listed: ids,
      paused: paused.data.servicePaused,
    }),
);
