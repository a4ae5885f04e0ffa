// Renders each Mermaid text of a JSON array on stdin to SVG with the real `mermaid` package under jsdom;
// prints [{ok, error?}, ...]. Parsing alone misses what happens only at render time (KaTeX `$$...$$` in a
// label fails the whole render). jsdom has no layout, so text is measured as a fixed box: the sizes are
// wrong, the code paths are the ones a browser takes.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const require = createRequire(process.env.MERMAID_DIR + "/package.json");
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);
const { JSDOM } = await load("jsdom");
const dom = new JSDOM("<!DOCTYPE html><body></body>", { pretendToBeVisual: true });
globalThis.window = dom.window;
globalThis.document = dom.window.document;
for (const k of ["DOMParser", "Element", "HTMLElement", "Node", "CSSStyleSheet", "SVGElement", "getComputedStyle"]) {
  if (!(k in globalThis)) globalThis[k] = dom.window[k];
}
window.MathMLElement ??= function MathMLElement() {};  // a browser has it: KaTeX labels take the MathML path
dom.window.SVGElement.prototype.getBBox = () => ({ x: 0, y: 0, width: 50, height: 10 });
dom.window.SVGElement.prototype.getComputedTextLength = () => 50;
const mermaid = (await load("mermaid")).default;
mermaid.initialize({ startOnLoad: false });
let input = "";
for await (const chunk of process.stdin) input += chunk;
const out = [];
let n = 0;
for (const text of JSON.parse(input)) {
  try {
    await mermaid.render(`d${n++}`, text);
    out.push({ ok: true });
  } catch (e) {
    out.push({ ok: false, error: String(e.message || e).slice(0, 800) });
  }
}
process.stdout.write(JSON.stringify(out));
