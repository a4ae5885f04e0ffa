// One TypeScript SDK client over Streamable HTTP that calls `echo` before and after the daemon
// restarts, on the same Client and transport (tests/e2e/test_http_sessions.py).
// Usage: DIAGD_NODE_SDK=<dir holding node_modules> DIAGD_TOKEN=<token> node http_session_client.mjs URL
// Prints "before: before", waits for a line on stdin (the test restarts the daemon), prints "after: after".
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

async function echo(message) {
  const result = await client.callTool({ name: "echo", arguments: { message } });
  if (result.isError) throw new Error(`echo failed: ${JSON.stringify(result)}`);
  return JSON.parse(result.content[0].text).message;
}

await client.connect(transport);
const sessionId = transport.sessionId;
console.log(`before: ${await echo("before")}`);
const lines = readline.createInterface({ input: process.stdin });
await new Promise((resolve) => lines.once("line", resolve));
lines.close();
const after = await echo("after");
if (transport.sessionId !== sessionId) throw new Error(`session changed: ${sessionId} -> ${transport.sessionId}`);
console.log(`after: ${after}`);
await client.close();
