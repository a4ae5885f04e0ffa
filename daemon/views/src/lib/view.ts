// What every view shares: the MCP Apps connection (an App of @modelcontextprotocol/ext-apps talking to its
// host over postMessage), tool calls through the host, and DOM helpers that put text in as text only.
// Packets, logs and arguments are untrusted: they go into the DOM through textContent, never as markup.
import { App } from "@modelcontextprotocol/ext-apps";

export type Json = Record<string, unknown>;

/** An element with its class and text (set as textContent: never parsed as HTML). */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K, cls?: string, text?: string | number | null, ...children: Node[]): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const child of children) node.appendChild(child);
  return node;
}

export function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number> = {},
                                                          text?: string): SVGElementTagNameMap[K] {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

export function byId<T extends HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (!found) throw new Error(`#${id} is missing`);
  return found as T;
}

export function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A tool's failure as diagd gives it: the text of an isError result ({code, message, details} JSON). */
export class ToolError extends Error {}

function resultText(result: { content?: unknown }): string {
  const parts = Array.isArray(result.content) ? result.content : [];
  return parts.map((p) => (isObject(p) && typeof p.text === "string" ? p.text : "")).join("\n");
}

function failureText(text: string): string {
  try {
    const parsed: unknown = JSON.parse(text);
    if (isObject(parsed) && typeof parsed.message === "string") {
      return typeof parsed.code === "string" ? `${parsed.code}: ${parsed.message}` : parsed.message;
    }
  } catch { /* not JSON: shown as it is */ }
  return text;
}

/** The structured result of a tool result, or a ToolError carrying its message. */
export function structured(result: { content?: unknown; structuredContent?: unknown; isError?: boolean }): Json {
  if (result.isError) throw new ToolError(failureText(resultText(result)));
  if (isObject(result.structuredContent)) return result.structuredContent;
  try {
    const parsed: unknown = JSON.parse(resultText(result));
    if (isObject(parsed)) return parsed;
  } catch { /* below */ }
  throw new ToolError("the tool's result has no structured content");
}

/** One view's connection to its host: the tool's arguments and result as the host sends them, and the
 * tools it calls back through the host (tools/call, forwarded to diagd). */
export class View {
  readonly app: App;
  args: Json = {};

  constructor(name: string, private readonly onResult: (result: Json, args: Json) => void,
              private readonly onError: (message: string) => void) {
    this.app = new App({ name: `diagd ${name}`, version: "1.0.0" }, {}, { autoResize: true });
    this.app.ontoolinput = (params) => { this.args = isObject(params.arguments) ? params.arguments : {}; };
    this.app.ontoolresult = (result) => {
      try {
        this.onResult(structured(result), this.args);
      } catch (err) {
        this.onError(err instanceof Error ? err.message : String(err));
      }
    };
  }

  async connect(): Promise<void> {
    await this.app.connect();
  }

  async call(name: string, args: Json): Promise<Json> {
    return structured(await this.app.callServerTool({ name, arguments: args }));
  }

  /** Call a tool through the host, saying `loading` on the status line meanwhile; hand its answer on,
   *  or say what went wrong there. */
  async ask(name: string, args: Json, line: HTMLElement, loading: string,
            onAnswer: (answer: Json) => void): Promise<void> {
    status(line, loading);
    try {
      onAnswer(await this.call(name, args));
    } catch (err) {
      status(line, err instanceof Error ? err.message : String(err), true);
    }
  }
}

/** The status line: what the view is doing, or what went wrong. */
export function status(node: HTMLElement, text: string, error = false): void {
  node.textContent = text;
  node.classList.toggle("error", error);
}

/** The arguments that name the capture and how it is decoded, carried into the calls a view makes. */
export function captureArgs(args: Json): Json {
  const out: Json = {};
  for (const key of ["pcap_path", "decode_as", "profile"]) if (args[key] !== undefined) out[key] = args[key];
  return out;
}
