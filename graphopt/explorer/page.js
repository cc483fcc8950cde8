// The explorer's page: plain JavaScript over the data graphopt embedded (explorer/data.py).
// Everything is drawn from DATA on demand (a view when it is shown), so a large step opens
// quickly; nothing is fetched.
"use strict";

const DATA = JSON.parse(document.getElementById("data").textContent);
const state = { pass: -1, snapshot: 0, node: null, kernel: null, path: [] };
const SVG_NS = "http://www.w3.org/2000/svg";

// -- small helpers --------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}
function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}
function bytes(n) {
  if (n < 10000) return n + " B";
  if (n < 10000000) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1048576).toFixed(1) + " MiB";
}
function where(locs) {
  return locs.map(i => DATA.locations[i].where).join(", ");
}
function show(id, ...children) {
  const box = document.getElementById(id);
  box.replaceChildren(...children);
  return box;
}
function openTab(name) {
  for (const b of document.querySelectorAll("#tabs button"))
    b.classList.toggle("active", b.dataset.tab === name);
  for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t.id === name);
}

// -- the snapshot's nodes, indexed once per snapshot ------------------------------------------
// The data leaves a node's empty fields out (a smaller page): they are filled in here.
const EMPTY = { name: "", type: "", attrs: "", locs: [], ins: [], after: [], writes: [] };
const indexes = new Map();
function nodesOf(snapshot) {
  if (!indexes.has(snapshot)) {
    const byId = new Map(), users = new Map();
    for (const n of DATA.snapshots[snapshot].nodes) {
      for (const [k, v] of Object.entries(EMPTY)) if (!(k in n)) n[k] = v;
      byId.set(n.id, n);
      for (const [kind, list] of [["data", n.ins], ["after", n.after]])
        for (const src of list) {
          if (!users.has(src)) users.set(src, []);
          users.get(src).push([kind, n.id]);
        }
    }
    indexes.set(snapshot, { byId, users });
  }
  return indexes.get(snapshot);
}
function nodeLink(id) {
  const n = nodesOf(state.snapshot).byId.get(id);
  const label = n ? `${n.name || n.op} = ${n.op}`.replace(/^(\S+) = \1$/, "$1") : id;
  return el("a", { class: "node", "data-id": id, onclick: () => selectNode(id) }, label);
}

// -- the pass timeline ----------------------------------------------------------------------
function renderTimeline() {
  const rows = [el("tr", {}, ...["pass", "ms", "nodes", "kernels", "MB read", "MB written"]
    .map(h => el("th", {}, h)))];
  rows.push(el("tr", { "data-pass": "-1", onclick: () => selectPass(-1) },
    el("td", {}, "as traced"), el("td"), el("td", {}, String(DATA.passes.length ?
      DATA.passes[0].nodes_before : DATA.snapshots[0].nodes.length)), el("td"), el("td"),
    el("td")));
  DATA.passes.forEach((p, i) => {
    const notes = Object.entries(p.counters).map(([k, v]) => `${k}=${v}`).join(", ");
    const tr = el("tr", { "data-pass": String(i), class: p.changed ? "changed" : "unchanged",
                          title: p.changed ? notes : "no change", onclick: () => selectPass(i) },
      el("td", {}, p.name), el("td", {}, p.ms.toFixed(2)),
      el("td", {}, `${p.nodes_before}\u2192${p.nodes_after}`), el("td", {}, String(p.kernels)),
      el("td", {}, (p.bytes_read / 1e6).toFixed(3)),
      el("td", {}, (p.bytes_written / 1e6).toFixed(3)));
    rows.push(tr);
  });
  show("timeline", ...rows);
}

function selectPass(i) {
  state.pass = i;
  const snapshot = i < 0 ? 0 : DATA.passes[i].snapshot;
  if (snapshot !== state.snapshot) Object.assign(state, { snapshot, node: null, path: [] });
  for (const tr of document.querySelectorAll("#timeline tr[data-pass]"))
    tr.classList.toggle("selected", Number(tr.dataset.pass) === i);
  renderDiff();
  renderIR();
  renderGraph();
  openTab(i >= 0 && DATA.passes[i].changed ? "diff" : "ir");
}

// -- the diff and the IR --------------------------------------------------------------------
function renderDiff() {
  if (state.pass < 0) {
    show("diff", el("p", { class: "note" }, "The graph as traced: select a pass to see what it changed."));
    return;
  }
  const p = DATA.passes[state.pass];
  const head = el("h3", {}, `${p.name}: ${p.nodes_before} \u2192 ${p.nodes_after} nodes, ` +
                  `${p.kernels} kernels, ${p.ms.toFixed(2)} ms`);
  const parts = [head];
  if (!p.changed) parts.push(el("p", { class: "note" }, "no change"));
  else {
    parts.push(el("p", { class: "note" }, "Values are paired by identity: a value the pass " +
      "kept, or one that took the place of another, keeps its name, so only what changed shows."));
    const pre = el("pre", { class: "diff" });
    for (const line of p.diff.split("\n")) {
      const cls = line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" :
        line.startsWith("-") ? "del" : "";
      pre.append(el("div", cls ? { class: cls } : {}, line || " "));
    }
    parts.push(pre);
  }
  if (p.refusals.length) {
    parts.push(el("h3", {}, `${p.name} refused ${p.refusals.length}`));
    for (const r of p.refusals) parts.push(refusal(r));
  }
  show("diff", ...parts);
}

function refusal(r) {
  const at = r.locs.length ? ` [${where(r.locs)}]` : "";
  return el("div", { class: "refusal" }, el("span", { class: "code" }, r.subject),
            at + ": " + r.reason);
}

function renderIR() {
  const s = DATA.snapshots[state.snapshot];
  const nodes = s.nodes.filter(n => !["param", "arg", "return"].includes(n.op)).length;
  show("ir", el("h3", {}, `IR ${s.label} (${nodes} nodes)`),
       el("pre", {}, s.ir));
}

// -- the drawing ------------------------------------------------------------------------------
function renderGraph() {
  const s = DATA.snapshots[state.snapshot];
  const box = show("graph", el("h3", {}, `graph ${s.label}`));
  if (!s.svg) { box.append(el("p", { class: "note", id: "no-drawing" }, s.svg_note)); return; }
  box.append(el("p", { class: "note" }, "Data edges are solid, after and effect edges " +
    "dashed; parameters are cylinders, assigns red, kernels clusters of their body; a node's " +
    "colour is its op's category. Click a node for its details; hovering highlights its edges."),
    legend(s));
  const holder = el("div", { id: "drawing" });
  holder.innerHTML = s.svg;  // made by graphviz from the data: labels are escaped by dot
  box.append(el("button", { onclick: () => holder.classList.toggle("actual") },
                "fit width / actual size"), holder);
  holder.addEventListener("click", e => {
    const g = e.target.closest("g.node");
    if (g) selectNode(drawnId(g).split("_")[0]);  // a body node (n5_n2): its kernel (n5)
  });
  holder.addEventListener("mouseover", e => {
    const g = e.target.closest("g.node");
    if (g) highlightEdges(drawnId(g));
  });
  markPath();
}
// The op categories of the snapshot, each in its colour (the drawing's).
function legend(snapshot) {
  const seen = new Map();
  for (const n of snapshot.nodes)
    if (!["param", "arg", "return", "effect"].includes(n.cat)) seen.set(n.cat, n.color);
  return el("p", { id: "legend" }, ...[...seen].sort().map(([cat, c]) =>
    el("span", { class: "legend" }, el("span", { class: "badge", style: `background:${c}` }), cat)));
}
// The node's id in the drawing: its title, which graphviz writes from the DOT node's name.
function drawnId(g) {
  return g.querySelector("title").textContent;
}
function highlightEdges(id) {
  for (const e of document.querySelectorAll("#graph g.edge")) {
    const ends = e.querySelector("title").textContent.split("->").map(end => end.split(":")[0]);
    e.classList.toggle("hl", ends.includes(id));
  }
}
function markPath() {
  const on = new Set(state.path);
  if (state.node) on.add(state.node);
  for (const g of document.querySelectorAll("#graph g.node"))
    g.classList.toggle("hl", on.has(drawnId(g)));
}

// -- a node's details -------------------------------------------------------------------------
function selectNode(id) {
  const { byId, users } = nodesOf(state.snapshot);
  const n = byId.get(id);
  if (!n) return;
  state.node = id;
  const uses = users.get(id) || [];
  const list = ids => ids.length ? el("span", {}, ...ids.flatMap((u, i) =>
    i ? [", ", nodeLink(u)] : [nodeLink(u)])) : "none";
  const parts = [el("h3", {}, el("span", { class: "badge", style: `background:${n.color}` }),
                    `${n.name} = ${n.op}`),
    el("pre", {}, n.line),
    el("dl", {}, el("dt", {}, "op"), el("dd", {}, `${n.op} (${n.cat})`),
       el("dt", {}, "type"), el("dd", {}, n.type || "none"),
       el("dt", {}, "attributes"), el("dd", {}, n.attrs || "none"),
       el("dt", {}, "reads"), el("dd", {}, list(n.ins)),
       el("dt", {}, "after"), el("dd", {}, list(n.after)),
       el("dt", {}, "read by"), el("dd", {}, list(uses.filter(u => u[0] === "data").map(u => u[1]))),
       el("dt", {}, "ordered before"), el("dd", {}, list(uses.filter(u => u[0] === "after").map(u => u[1]))),
       el("dt", {}, "writes"), el("dd", {}, list(n.writes)))];
  parts.push(el("h3", {}, "source"));
  if (!n.locs.length) parts.push(el("p", { class: "note" }, "no source location"));
  for (const i of n.locs) {
    const loc = DATA.locations[i];
    parts.push(el("div", { class: "source", title: `${loc.file}:${loc.line}` },
      el("span", {}, loc.where + " "), el("span", { class: "code" }, loc.code || "(line not found)")));
  }
  if (n.op === "param")
    parts.push(el("p", {}, el("button", { id: "show-path", onclick: () => showPath(id) },
      `highlight the whole path of ${n.name}`)));
  const kernel = DATA.kernels.find(k => k.id === id);
  if (kernel && state.snapshot === DATA.snapshots.length - 1)
    parts.push(el("p", {}, el("button", { onclick: () => selectKernel(kernel.id) },
      "show this kernel")));
  show("details", ...parts);
  markPath();
}

// A parameter's whole path: the nodes that read it, those that write it (assigns, kernels
// that store it in place), and what reads those.
function showPath(id) {
  const { byId, users } = nodesOf(state.snapshot);
  const readers = (users.get(id) || []).map(u => u[1]);
  const writers = [...byId.values()].filter(n => n.writes.includes(id)).map(n => n.id);
  state.path = [id, ...new Set([...readers, ...writers])];
  markPath();
  const box = document.getElementById("details");
  box.append(el("h3", {}, `path of ${byId.get(id).name}`),
    el("ul", { class: "results", id: "path" }, ...state.path.slice(1).map(u =>
      el("li", {}, writers.includes(u) ? "writes: " : "reads: ", nodeLink(u)))));
}

// -- the kernels --------------------------------------------------------------------------------
function renderKernelList() {
  const items = DATA.kernels.map(k => el("li", { "data-kernel": k.id,
    onclick: () => selectKernel(k.id) }, `${k.id}: ${k.cost.bytes_per_element} B/elem, ` +
    `${k.fused.length} ops` + (k.refusals.length ? `, ${k.refusals.length} refused` : "")));
  show("kernel-list", ...(items.length ? items : [el("li", { class: "note" }, "no kernels")]));
}

function selectKernel(id) {
  const k = DATA.kernels.find(k => k.id === id);
  state.kernel = id;
  if (state.snapshot !== DATA.snapshots.length - 1) selectPass(DATA.passes.length - 1);
  for (const li of document.querySelectorAll("#kernel-list li"))
    li.classList.toggle("selected", li.dataset.kernel === id);
  const c = k.cost;
  const parts = [el("h3", {}, `kernel ${id}, made by ${k.made_by}`), el("pre", {}, k.text),
    el("h3", {}, "iteration spaces and cost"),
    el("dl", { id: "kernel-cost" },
       el("dt", {}, "spaces"), el("dd", {}, JSON.stringify(k.spaces)),
       el("dt", {}, "outputs"), el("dd", {}, JSON.stringify(k.outputs)),
       el("dt", {}, "bytes per element"),
       el("dd", {}, `${c.bytes_per_element} (read ${c.read_per_element}, write ${c.write_per_element})`),
       el("dt", {}, "elements"), el("dd", {}, String(c.elements)),
       el("dt", {}, "once"), el("dd", {}, bytes(c.fixed_bytes)),
       el("dt", {}, "total per run"), el("dd", {}, bytes(c.total_bytes))),
    el("h3", {}, `fused into it: ${k.fused.length} ops`),
    el("ul", { class: "results" }, ...k.fused.map(f => el("li", {}, f.op +
      (f.locs.length ? ` (${where(f.locs)})` : "")))),
    el("h3", {}, "refused merges about its lines")];
  if (!k.refusals.length) parts.push(el("p", { class: "note" }, "none"));
  for (const r of k.refusals) parts.push(el("div", {}, `${r.pass}: `, refusal(r)));
  parts.push(el("h3", {}, "native code"));
  if (!k.native) parts.push(el("p", { class: "note" }, `runs through numpy: ${k.fallback}`));
  else {
    const nat = k.native;
    parts.push(el("dl", {},
      el("dt", {}, "function"), el("dd", {}, nat.name),
      el("dt", {}, "cache"), el("dd", { class: nat.hit ? "hit" : "miss" },
        nat.hit ? "hit (loaded from the cache)" : "miss (compiled now)"),
      el("dt", {}, "compile time"), el("dd", {}, `${nat.compile_ms.toFixed(1)} ms`),
      el("dt", {}, "cache key"), el("dd", {}, el("span", { class: "code" }, nat.key))));
    parts.push(el("h3", {}, "cache key parts"));
    for (const [name, value] of Object.entries(nat.key_parts))
      parts.push(el("details", {}, el("summary", {}, `${name}: ${String(value).split("\n")[0]}`),
                    el("pre", {}, value)));
    parts.push(el("details", { open: "" }, el("summary", {}, "optimised LLVM IR"),
                  el("pre", { class: "llvm" }, nat.llvm)),
               el("details", {}, el("summary", {}, "assembly"), el("pre", { class: "asm" }, nat.asm)));
  }
  show("kernel", ...parts);
  openTab("kernel");
  selectNode(id);
}

// -- the memory plot ----------------------------------------------------------------------------
function renderMemory() {
  const m = DATA.memory, n = m.live.length;
  const box = show("memory", el("h3", {}, `bytes live along the schedule (${n} nodes): peak ` +
    `${bytes(m.peak_bytes)} with ${bytes(m.input_bytes)} of inputs; kept for the backward: ` +
    `${bytes(m.kept_bytes)} in ${m.kept.length} values`));
  if (!n) { box.append(el("p", { class: "note" }, "no nodes")); return; }
  const W = 900, H = 260, L = 70, B = 30, top = Math.max(...m.live, 1);
  const x = i => L + (W - L - 10) * (n > 1 ? i / (n - 1) : 0.5);
  const y = v => H - B - (H - B - 10) * v / top;
  const svg = svgEl("svg", { width: W, height: H + 20 * Math.min(m.kept.length, 1), id: "memory-plot" });
  svg.append(svgEl("line", { x1: L, y1: H - B, x2: W - 10, y2: H - B, stroke: "#888" }),
             svgEl("line", { x1: L, y1: 10, x2: L, y2: H - B, stroke: "#888" }));
  for (const v of [0, top / 2, top]) {
    const t = svgEl("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end" });
    t.textContent = bytes(Math.round(v));
    svg.append(t);
  }
  const points = m.live.map((v, i) => `${x(i)},${y(v)}`).join(" ");
  svg.append(svgEl("polygon", { points: `${x(0)},${y(0)} ${points} ${x(n - 1)},${y(0)}`,
                                fill: "#90caf9", stroke: "#1565c0" }));
  if (m.backward_start !== null) {
    svg.append(svgEl("line", { x1: x(m.backward_start), x2: x(m.backward_start), y1: 10,
                               y2: H - B, stroke: "#6a1b9a", "stroke-dasharray": "4 3" }));
    const t = svgEl("text", { x: x(m.backward_start) + 4, y: 22, fill: "#6a1b9a" });
    t.textContent = "backward starts";
    svg.append(t);
  }
  m.kept.forEach((r, j) => {  // what the backward keeps alive: a bar from made to last read
    const bar = svgEl("line", { x1: x(r.defined), x2: x(Math.min(r.last_use, n - 1)),
      y1: H - B + 8 + (j % 4) * 4, y2: H - B + 8 + (j % 4) * 4, stroke: "#d84315",
      "stroke-width": 3, class: "kept" });
    const tip = svgEl("title", {});
    tip.textContent = `${r.name}: ${bytes(r.bytes)} kept for the backward, nodes ${r.defined}-${r.last_use}`;
    bar.append(tip);
    svg.append(bar);
  });
  m.live.forEach((v, i) => {  // a hover target per node
    const hit = svgEl("rect", { x: x(i) - 2, y: 10, width: 4, height: H - B - 10, fill: "transparent" });
    const tip = svgEl("title", {});
    tip.textContent = `node ${i} ${m.labels[i]}: ${bytes(v)} live`;
    hit.append(tip);
    svg.append(hit);
  });
  box.append(svg, el("p", { class: "note" }, "Orange bars under the axis: values the forward " +
    "makes and the backward reads, from where they are made to their last read."),
    el("pre", {}, m.text));
}

// -- search -------------------------------------------------------------------------------------
const MAX_RESULTS = 200;
function search(query) {
  const q = query.trim().toLowerCase();
  if (!q) return;
  const hits = [];
  for (const n of nodesOf(state.snapshot).byId.values()) {
    const text = [n.op, n.name, n.line, ...n.locs.map(i => DATA.locations[i].where)]
      .join(" ").toLowerCase();
    if (text.includes(q)) hits.push(n);
  }
  const items = hits.slice(0, MAX_RESULTS).map(n => el("li", {}, nodeLink(n.id),
    n.locs.length ? ` (${where(n.locs)})` : ""));
  show("results", el("h3", {}, `${hits.length} nodes ${DATA.snapshots[state.snapshot].label} ` +
    `match "${query.trim()}"` + (hits.length > MAX_RESULTS ? ` (the first ${MAX_RESULTS} shown)` : "")),
    el("ul", { class: "results", id: "result-list" }, ...items));
  openTab("results");
  state.path = hits.map(n => n.id);
  markPath();
}

// -- start ------------------------------------------------------------------------------------
document.getElementById("title").textContent = DATA.title;
document.getElementById("target").textContent = `LLVM target ${DATA.target}; graphs ${DATA.drawing}.`;
for (const b of document.querySelectorAll("#tabs button"))
  b.addEventListener("click", () => openTab(b.dataset.tab));
let pending = null;
document.getElementById("search").addEventListener("input", e => {
  clearTimeout(pending);  // search once typing pauses, not on every key of a long graph
  pending = setTimeout(() => search(e.target.value), 150);
});
renderTimeline();
renderKernelList();
renderMemory();
selectPass(DATA.passes.length - 1);
openTab("ir");
document.body.dataset.ready = "yes";
