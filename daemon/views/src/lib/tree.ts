// A frame's decoded tree (pcap_frame_detail: tshark -V text) as nested <details>, one per indented line.
import { el, type Json } from "./view";

interface Line { depth: number; text: string }

function lines(text: string): Line[] {
  return text.split("\n").filter((l) => l.trim() !== "").map((l) => {
    const indent = l.length - l.trimStart().length;
    return { depth: Math.floor(indent / 4), text: l.trim() };
  });
}

function grow(parent: HTMLElement, items: Line[], start: number, depth: number): number {
  let i = start;
  while (i < items.length && items[i].depth >= depth) {
    const item = items[i];
    const hasChildren = i + 1 < items.length && items[i + 1].depth > item.depth;
    if (hasChildren) {
      const node = el("details", "node");
      node.open = item.depth === 0;
      node.appendChild(el("summary", undefined, item.text));
      parent.appendChild(node);
      i = grow(node, items, i + 1, item.depth + 1);
    } else {
      parent.appendChild(el("div", "leaf", item.text));
      i += 1;
    }
  }
  return i;
}

/** The frames of a pcap_frame_detail result as trees (text only). */
export function renderDetail(target: HTMLElement, detail: Json): void {
  target.replaceChildren();
  const frames = Array.isArray(detail.frames) ? detail.frames : [];
  for (const frame of frames) {
    const f = frame as Json;
    const box = el("section", "frame-tree");
    box.dataset.frame = String(f.frame_number ?? "");
    box.appendChild(el("h3", undefined, `Frame ${String(f.frame_number ?? "?")}` +
      (Array.isArray(f.protocols) ? ` — ${f.protocols.join(":")}` : "")));
    grow(box, lines(typeof f.text === "string" ? f.text : ""), 0, 0);
    if (f.truncated) box.appendChild(el("div", "note", "(cut at max_bytes)"));
    target.appendChild(box);
  }
  if (!frames.length) target.appendChild(el("div", "note", "no frame decoded"));
}
