// One TypeScript SDK client over Streamable HTTP whose call is in flight when the daemon restarts
// (tests/e2e/test_http_inflight.py). Usage: DIAGD_NODE_SDK=<dir holding node_modules> DIAGD_TOKEN=<token>
// node http_inflight_client.mjs URL
// Prints "in flight" once the echo actor is busy with its slow call, then the error that call got as one
// JSON line ({code, message, data}), waits for a line on stdin (the restart is done), then {"after": ...}
// from a call on the same session.
import { createRequire } from "node:module";
import path from "node:path";
import readline from "node:readline";

const require = createRequire(path.join(process.env.DIAGD_NODE_SDK, "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const url = new URL(process.argv[2]);
const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${process.env.DIAGD_TOKEN}` } },
});
const client = new Client({ name: "diagd-test", version: "0" });
await client.connect(transport);
const sessionId = transport.sessionId;

// Its outcome is taken at once (an error, or null for an answer): a rejection left unhandled ends node.
const slow = client.callTool({ name: "echo", arguments: { message: "slow", resource: "inflight", delay_s: 60 } })
  .then(() => null, (error) => error);
for (;;) {  // until the actor is busy with it
  const status = await client.callTool({ name: "diagd_status", arguments: {} });
  if (status.structuredContent.actors.some((a) => a.resource === "inflight" && a.state === "busy")) break;
  await new Promise((resolve) => setTimeout(resolve, 50));
}
console.log("in flight");
const error = await slow;
if (error === null) throw new Error("the slow call was answered: the daemon did not restart under it");
if (error.code === undefined) throw error;
console.log(JSON.stringify({ code: error.code, message: error.message, data: error.data }));
const lines = readline.createInterface({ input: process.stdin });  // the test says when the new daemon is up
await new Promise((resolve) => lines.once("line", resolve));
lines.close();
const after = await client.callTool({ name: "echo", arguments: { message: "after", resource: "inflight" } });
if (after.isError) throw new Error(`echo failed: ${JSON.stringify(after)}`);
if (transport.sessionId !== sessionId) throw new Error(`session changed: ${sessionId} -> ${transport.sessionId}`);
console.log(JSON.stringify({ after: JSON.parse(after.content[0].text).message }));
await client.close();
