// Launch an MCP server over stdio with the TypeScript SDK's StdioClientTransport and its default
// environment, call diagd_status, print {daemon, launcher_env} as JSON.
// Usage: node ts_stdio_status.mjs SDK_PREFIX COMMAND [ARGS...]
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [prefix, command, ...args] = process.argv.slice(2);
const sdk = (p) => import(pathToFileURL(join(prefix, "node_modules/@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport, getDefaultEnvironment } = await sdk("client/stdio.js");

const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client({ name: "diagd-test", version: "1" });
await client.connect(transport);
const result = await client.callTool({ name: "diagd_status", arguments: {} });
if (result.isError) throw new Error(JSON.stringify(result.content));
const status = JSON.parse(result.content[0].text);
process.stdout.write(JSON.stringify({ daemon: status.daemon, launcher_env: Object.keys(getDefaultEnvironment()) }));
await client.close();
