// An MCP Apps host's side of one view (an AppBridge of @modelcontextprotocol/ext-apps, over postMessage,
// checked by source): shared by the web view's host (src/web-host) and the test host (test/host.ts).
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

export type CallTool = (name: string, args: Record<string, unknown> | undefined) => Promise<Record<string, unknown>>;

export interface Shown {
  toolName: string;
  args: Record<string, unknown>;
  result: Record<string, unknown>;  // a CallToolResult (structuredContent, content, isError)
  onStatus?: (text: string) => void;
}

/** A bridge joined to `iframe` before its document loads: once the view initialises it gets the tool's
 *  input and result (`ready` then resolves); the tools it calls go to `callTool`, its height to the iframe. */
export async function joinView(iframe: HTMLIFrameElement, host: string, shown: Shown, callTool: CallTool
): Promise<{ bridge: AppBridge; ready: Promise<void> }> {
  const target = iframe.contentWindow as Window;
  const bridge = new AppBridge(null, { name: host, version: "1.0.0" }, { serverTools: {}, logging: {} });
  bridge.oncalltool = async (params) =>
    (await callTool(params.name, params.arguments)) as Awaited<ReturnType<NonNullable<typeof bridge.oncalltool>>>;
  bridge.onsizechange = ({ height }) => { if (height) iframe.style.height = `${Math.min(height + 4, 5000)}px`; };
  const ready = new Promise<void>((resolve) => {
    bridge.oninitialized = () => {
      void (async () => {
        await bridge.sendToolInput({ arguments: shown.args });
        await bridge.sendToolResult(shown.result as Parameters<typeof bridge.sendToolResult>[0]);
        shown.onStatus?.(`showing ${shown.toolName}`);
        resolve();
      })();
    };
  });
  await bridge.connect(new PostMessageTransport(target, target));
  return { bridge, ready };
}
