// A minimal MCP Apps host for tests/e2e/test_views.py (test only: never shipped to a client). It renders a
// view's HTML (as the daemon's resources/read gave it) in a sandboxed iframe, under the CSP a host derives
// from the resource's `_meta.ui.csp` when asked, and joins it with an AppBridge of @modelcontextprotocol/
// ext-apps: the tool's input and result go to the view, and the view's tools/call go to
// `window.diagdCallTool` (exposed by the test: a call to a real daemon through the real shim).
import { joinView } from "../src/lib/bridge";

declare global {
  interface Window {
    diagdCallTool?: (params: string) => Promise<string>;
    diagdHost: { load(options: LoadOptions): Promise<void>; calls: string[] };
  }
}

interface LoadOptions {
  html: string;
  toolName: string;
  args: Record<string, unknown>;
  result: Record<string, unknown>;
  csp: string | null;  // a Content-Security-Policy for the view's document, or none
}

const calls: string[] = [];

function withCsp(html: string, csp: string | null): string {
  if (csp === null) return html;
  const meta = `<meta http-equiv="Content-Security-Policy" content="${csp.replace(/"/g, "&quot;")}">`;
  return html.replace(/<head>/i, `<head>${meta}`);
}

async function load(options: LoadOptions): Promise<void> {
  const status = document.getElementById("host-status") as HTMLElement;
  const holder = document.getElementById("frame") as HTMLElement;
  const iframe = document.createElement("iframe");
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.id = "view";
  holder.replaceChildren(iframe);
  const { ready } = await joinView(iframe, "diagd-test-host", {
    ...options, onStatus: (text) => { status.textContent = text; },
  }, async (name, args) => {
    calls.push(name);
    if (!window.diagdCallTool) throw new Error("no daemon behind this host");
    return JSON.parse(await window.diagdCallTool(JSON.stringify({ name, arguments: args })));
  });
  iframe.srcdoc = withCsp(options.html, options.csp);
  await ready;
}

window.diagdHost = { load, calls };
