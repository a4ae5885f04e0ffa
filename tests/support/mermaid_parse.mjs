// Parses each Mermaid text of a JSON array on stdin with the real `mermaid` package under jsdom;
// prints [{ok, error?}, ...]. MERMAID_DIR is where `npm install mermaid jsdom` put node_modules
// (scripts/setup.sh: ~/.cache/diagd/mermaid), so nothing of node's lands in the repository.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const require = createRequire(process.env.MERMAID_DIR + "/package.json");
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);
const { JSDOM } = await load("jsdom");
const dom = new JSDOM("<!DOCTYPE html><body></body>", { pretendToBeVisual: true });
globalThis.window = dom.window;
globalThis.document = dom.window.document;
for (const k of ["DOMParser", "Element", "HTMLElement", "Node"]) if (!(k in globalThis)) globalThis[k] = dom.window[k];
const mermaid = (await load("mermaid")).default;
mermaid.initialize({ startOnLoad: false });
let input = "";
for await (const chunk of process.stdin) input += chunk;
const out = [];
for (const text of JSON.parse(input)) {
  try {
    const parsed = await mermaid.parse(text);
    out.push({ ok: true, type: parsed.diagramType });
  } catch (e) {
    out.push({ ok: false, error: String(e.message || e).slice(0, 800) });
  }
}
process.stdout.write(JSON.stringify(out));
