// Hand an agent an exec-only capability on one sandbox, for fifteen minutes. The agent's
// client holds only the delegated token: it can run commands in that sandbox and nothing
// else (no files, no delete, no other sandbox), and it stops working when revoked.
import { Client, PermissionDenied } from "@sandgate/sdk";

const client = new Client();
const sandbox = await client.sandboxes.create({ labels: { example: "agent" } });
const until = new Date(Date.now() + 15 * 60 * 1000);
const delegation = await sandbox.delegate(["exec"], { agent: "build-agent", until });

// What the agent gets: the token (e.g. in its environment) and the sandbox id.
const agent = Client.fromDelegation(delegation);
const box = agent.sandbox();
process.stdout.write((await box.exec("echo hello from the agent")).stdout);
try {
  await box.files.write("/home/user/notes.txt", "not allowed");
} catch (e) {
  if (!(e instanceof PermissionDenied)) throw e;
  console.log("files.write refused:", e.code);
}

await client.delegations.revoke(delegation.id);
await sandbox.delete();
