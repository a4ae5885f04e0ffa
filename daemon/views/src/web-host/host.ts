// The web view's MCP Apps host (/ui, daemon/server/ui/web.py): shows a tool's view for a call the page
// lists, as Claude or VS Code would show it inline. The view's document comes from /ui/api/view/<name>
// (its own CSP: inline script and style only, no network) in an iframe sandboxed without
// allow-same-origin, so it runs in an opaque origin: it cannot read the page, its cookie or the daemon's
// API. It talks to this page alone, over postMessage (an AppBridge of @modelcontextprotocol/ext-apps):
// the call's input and result go to it, and the tools it calls (a frame's tree, the next page) come
// back here and go to the daemon as POST /ui/api/call, which runs read-only tools only.
import type { AppBridge } from "@modelcontextprotocol/ext-apps/app-bridge";
import { joinView, type Shown } from "../lib/bridge";

export interface ShowOptions extends Shown {
  holder: HTMLElement;   // where the iframe goes (its children are replaced)
  view: string;          // the view's name (ui://diagd/<view>)
}

declare global {
  interface Window {
    diagdWebHost: { show(options: ShowOptions): Promise<AppBridge>; callTool(name: string, args: unknown): Promise<Record<string, unknown>> };
  }
}

async function callTool(name: string, args: unknown): Promise<Record<string, unknown>> {
  const answer = await fetch("/ui/api/call", {
    method: "POST",
    credentials: "same-origin",
    cache: "no-store",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ tool: name, arguments: args ?? {} }),
  });
  if (!answer.ok) throw new Error(`${name}: ${answer.status} ${(await answer.text()).slice(0, 300)}`);
  return ((await answer.json()) as { result: Record<string, unknown> }).result;
}

async function show(options: ShowOptions): Promise<AppBridge> {
  const iframe = document.createElement("iframe");
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.setAttribute("title", `${options.toolName} view`);
  iframe.className = "view-frame";
  options.holder.replaceChildren(iframe);
  const { bridge, ready } = await joinView(iframe, "diagd-web-view", options, async (name, args) => {
    options.onStatus?.(`${options.toolName} view called ${name}`);
    return callTool(name, args);
  });
  iframe.src = `/ui/api/view/${encodeURIComponent(options.view)}`;
  await ready;
  return bridge;
}

window.diagdWebHost = { show, callTool };
