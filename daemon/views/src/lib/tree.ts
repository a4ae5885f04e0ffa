// A frame's decoded tree (pcap_frame_detail: tshark -V text) as nested <details>, one per indented line.
import { el, status, type Json, type View } from "./view";

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

/** Mark `chosen` (an arrow, a row, a bar) as the one shown, fetch its frame's tree through the host
 *  (pcap_frame_detail on the view's capture) and show it in `target`; `statusLine` says what happens. */
export async function showFrame(view: View, capture: Json, frame: number, chosen: Element, others: Iterable<Element>,
                                target: HTMLElement, statusLine: HTMLElement): Promise<void> {
  for (const other of others) other.classList.remove("selected");
  chosen.classList.add("selected");
  status(statusLine, `decoding frame ${frame}…`);
  try {
    renderDetail(target, await view.call("pcap_frame_detail", { ...capture, frame_numbers: [frame] }));
    status(statusLine, "");
  } catch (err) {
    status(statusLine, err instanceof Error ? err.message : String(err), true);
  }
}
