// Create a sandbox with routing preferences and watch the create fail over.
// SANDGATE_URL=http://127.0.0.1:7070 SANDGATE_TOKEN=... node failover.mjs
// Each attempt is printed as it starts and ends; the create resolves once the sandbox runs.
import { randomUUID } from "node:crypto";
import { Client, NoEligibleProvider } from "@sandgate/sdk";

const client = new Client();
const request = {
  // Cheapest first, then the fastest to start; every pool still must meet the request.
  routing: { priorities: ["price", "startup_latency"] },
  network: { allow_domains: ["api.github.com"] },
  labels: { example: "failover" },
};
const plan = await client.sandboxes.create(request, { dryRun: true });
console.log("would try:", plan.plan.map((step) => step.pool));
try {
  const sandbox = await client.sandboxes.create(request, {
    idempotencyKey: `example-${randomUUID()}`,
    onEvent: (e) => {
      if (e.type === "attempt_started") console.log(`attempt ${e.data.seq} on ${e.data.pool}: started`);
      if (e.type === "attempt_ended") console.log(`attempt ${e.data.seq} on ${e.data.pool}: ${e.data.outcome} ${e.data.error_class ?? ""}`);
    },
  });
  console.log(`${sandbox.id} runs on ${sandbox.info.placement.pool}`);
  process.stdout.write((await sandbox.exec("uname -sr")).stdout);
  await sandbox.delete();
} catch (e) {
  if (e instanceof NoEligibleProvider) {
    for (const a of e.attempts) console.log(`${a.pool}: cannot meet ${a.unmet_requirements}`);
  }
  throw e;
}
