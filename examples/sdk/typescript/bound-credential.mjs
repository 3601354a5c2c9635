// Store a secret bound to one destination; a sandbox uses it without ever holding it. The
// sandbox gets a placeholder in $API_TOKEN; the gateway's proxy swaps in the real secret only
// on requests to the credential's destination (EXAMPLE_HOST, default api.github.com, port
// EXAMPLE_PORT, default 443). Requests elsewhere carrying the placeholder are refused.
import { Client } from "@sandgate/sdk";

const host = process.env.EXAMPLE_HOST ?? "api.github.com";
const port = Number(process.env.EXAMPLE_PORT ?? "443");
const client = new Client(); // workspace: SANDGATE_WORKSPACE
const credential = await client.credentials.create("example-api", {
  secret: process.env.EXAMPLE_SECRET ?? "ghp_example_secret",
  destinations: [{ host, ports: [port] }],
  apply: { type: "header", name: "authorization", template: "Bearer {secret}" },
  placeholderEnv: "API_TOKEN",
});
console.log(credential.name, credential.destinations); // metadata only: the secret never comes back
const sandbox = await client.sandboxes.create({ credentials: ["example-api"], network: { allow_domains: [host] } });
process.stdout.write(`sandbox sees: ${(await sandbox.exec("echo $API_TOKEN")).stdout}`);
const out = await sandbox.exec(`curl -s -H "Authorization: Bearer $API_TOKEN" https://${host}:${port}/`);
console.log("origin answered:", out.stdout.slice(0, 200));
await sandbox.delete();
await client.credentials.delete("example-api");
