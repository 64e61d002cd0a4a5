/* torchlens graph page: every operation of one forward pass as a node, modules as boxes that
 * open and close on click, repeated blocks folded, rolled/unrolled views, search, tooltips and
 * a details panel (statistics, histogram, call stack with source). The data is inline in the
 * page (window.TORCHLENS_GRAPH, made by torchlens/render/graph_page); what is visible and where
 * it goes is graph_view.js + graph_layout.js; shared helpers are common.js. No network.
 *
 * Stable hooks: an operation's node has data-label="<layer label>", a closed module (or folded
 * run, which also has data-repeat="<n>") data-module="<address>"; the search box is
 * data-role="search", the side panel data-role="details"; a drawn edge has
 * data-edge="<tail>><head>", each end named by its data-label or data-module. Timings of every
 * re-layout are kept in window.__torchlensGraph.timings.
 *
 * An overlay (DATA.overlay, from graph_page/overlay.py) fills each node that has a value with
 * its colour (data-overlay="<value text>"), marks a closed module with the colour of the worst
 * value inside, and shows a legend (data-role="legend"); DATA.focus names the operation the
 * page opens on: its modules open, it is selected and centred, its details shown. */
(function () {
  "use strict";

  const UI = window.TorchlensUI;
  const { GraphModel, smoothPath, shapeText } = window.TorchlensGraphView;
  const Overlay = window.TorchlensGraphOverlay;
  const DATA = window.TORCHLENS_GRAPH;
  const $ = (role) => document.querySelector(`[data-role="${role}"]`);
  const svg = $("graph-svg");

  const model = new GraphModel(DATA);
  const state = { tree: null, zoom: { k: 1, x: 0, y: 0 }, selected: null, matches: [], matchAt: -1, query: "", undo: [], size: null };
  const perf = (window.__torchlensGraph = { timings: [], model });
  // a page that changes DATA.ops in place (the generation step slider) redraws through this
  perf.refresh = (what) => { render(what || "refresh"); if (state.selected !== null) showDetails(state.selected); };
  const view2d = UI.zoomPan(svg, () => svg.querySelector('[data-role="graph-root"]'), state.zoom, (t) => t.closest(".item, .box-head"));

  // ----- labels of the current mode -> node ------------------------------------------------
  function nodeOfLabel(label) {
    const view = model.view;
    if (!view._byLabel) {
      view._byLabel = new Map();
      view.nodes.forEach((node, i) => {
        view._byLabel.set(node.label, i);
        for (const op of node.ops || [node.op]) view._byLabel.set(DATA.ops[op].label, i);
      });
    }
    return view._byLabel.get(label);
  }

  // ----- drawing ------------------------------------------------------------------------------
  function render(what) {
    const t0 = performance.now();
    const tree = model.build();
    const t1 = performance.now();
    const info = model.layout(tree);
    const t2 = performance.now();
    draw(tree);
    const t3 = performance.now();
    state.tree = tree;
    state.size = info;
    let visible = 0;
    for (const it of tree.items.values()) if (it.kind !== "box") visible++;
    perf.timings.push({ what, visible, boxes: info.boxesLaidOut, buildMs: t1 - t0, layoutMs: t2 - t1, drawMs: t3 - t2, totalMs: t3 - t0 });
    markMatches();
    if (state.selected !== null) markSelected();
  }

  function draw(tree) {
    svg.textContent = "";
    // heads of a fixed size: a highlighted edge is thicker, its head is not (and is its colour)
    UI.arrowMarker(svg, "tl-arrow", "#6f747b", { fixed: true });
    UI.arrowMarker(svg, "tl-arrow-hot", "#1f5fa8", { fixed: true });
    const root = UI.svgEl("g", { "data-role": "graph-root" }, svg);
    const boxes = UI.svgEl("g", {}, root), edges = UI.svgEl("g", {}, root), nodes = UI.svgEl("g", {}, root);
    const drawBox = (box) => {
      if (box.parent) {
        const g = UI.svgEl("g", { class: "box", "data-box": model.view.modules[box.cid].address, "data-cid": box.cid }, boxes);
        UI.svgEl("rect", { x: box.x, y: box.y, width: box.w, height: box.h, rx: 8 }, g);
        UI.svgEl("rect", { class: "box-head", x: box.x, y: box.y, width: box.w, height: 22, rx: 8, fill: "transparent", "data-collapse": box.cid }, g);
        UI.svgEl("text", { x: box.x + 8, y: box.y + 11 }, g).textContent = `▾ ${box.title}`;
      }
      for (const c of box.children) if (c.kind === "box") drawBox(c);
    };
    drawBox(tree.root);
    const frag = document.createDocumentFragment();
    for (const e of tree.edges) {
      const p = UI.svgEl("path", { class: "edge", d: smoothPath(e.points), "marker-end": "url(#tl-arrow)", "data-from": e.a.id, "data-to": e.b.id, "data-edge": `${hookName(e.a)}>${hookName(e.b)}` }, frag);
      e.el = p;
      if (e.text) {
        const mid = e.points[Math.floor(e.points.length / 2)], prev = e.points[Math.floor(e.points.length / 2) - 1] || mid;
        UI.svgEl("text", { class: "edge-label", x: (mid[0] + prev[0]) / 2 + 4, y: (mid[1] + prev[1]) / 2 }, frag).textContent = e.text;
      }
    }
    edges.appendChild(frag);
    const items = document.createDocumentFragment();
    for (const it of tree.items.values()) if (it.kind !== "box") drawItem(it, items);
    nodes.appendChild(items);
    view2d.apply();
  }

  /** The name an item has in its stable hook: data-label for an operation, else data-module. */
  function hookName(it) { return it.kind === "op" ? it.label : model.view.modules[it.cid].address; }

  function drawItem(it, parent) {
    const cx = it.x + it.w / 2;
    if (it.kind === "op") {
      const node = model.view.nodes[it.node], op = DATA.ops[node.op];
      const attrs = { class: `item op k-${op.kind}${op.inside ? " inside" : ""}`, "data-label": it.label, "data-id": it.id, "data-type": op.type };
      if (node.passes > 1) attrs["data-passes"] = node.passes;
      const paint = overlayOf(node.label);
      if (paint) attrs["data-overlay"] = paint.text;
      const g = UI.svgEl("g", attrs, parent);
      let shape;
      if (op.kind === "untraced") {
        const { x, y, w, h } = it, c = 8;
        shape = UI.svgEl("polygon", { points: `${x + c},${y} ${x + w - c},${y} ${x + w},${y + h / 2} ${x + w - c},${y + h} ${x + c},${y + h} ${x},${y + h / 2}` }, g);
      } else {
        shape = UI.svgEl("rect", { x: it.x, y: it.y, width: it.w, height: it.h, rx: op.kind === "input" || op.kind === "output" ? 12 : 5 }, g);
      }
      const l1 = UI.svgEl("text", { class: "l1", x: cx, y: it.y + 12 }, g);
      l1.textContent = it.label + (node.passes > 1 ? ` ×${node.passes}` : "");
      const l2 = UI.svgEl("text", { class: "l2", x: cx, y: it.y + 25 }, g);
      l2.textContent = it.line2;
      if (paint) {  // inline style: above the kind's CSS fill, below nothing
        shape.style.fill = paint.fill;
        l1.style.fill = l2.style.fill = paint.ink;
      }
      return g;
    }
    const m = model.view.modules[it.cid];
    const attrs = { class: `item ${it.kind}${m.group ? ` group k-${m.group}` : ""}`, "data-module": m.address, "data-id": it.id, "data-cid": it.cid };
    if (m.passes > 1 && m.pass) attrs["data-pass"] = m.pass;
    if (m.group) attrs["data-group"] = m.ops;
    if (it.kind === "fold") {
      attrs["data-repeat"] = it.count;
      attrs["data-members"] = it.members.map((c) => model.view.modules[c].address).join(" ");
    }
    const worst = worstInside(it.kind === "fold" ? it.members : [it.cid]);
    if (worst) attrs["data-overlay"] = worst.text;
    const g = UI.svgEl("g", attrs, parent);
    if (it.kind === "fold") {
      UI.svgEl("rect", { class: "behind", x: it.x + 6, y: it.y + 6, width: it.w - 6, height: it.h - 6, rx: 6 }, g);
      UI.svgEl("rect", { class: "behind", x: it.x + 3, y: it.y + 3, width: it.w - 6, height: it.h - 6, rx: 6 }, g);
      UI.svgEl("rect", { x: it.x, y: it.y, width: it.w - 6, height: it.h - 6, rx: 6 }, g);
      UI.svgEl("text", { class: "l1", x: cx - 3, y: it.y + 13 }, g).textContent = it.title;
      UI.svgEl("text", { class: "badge", x: cx - 3, y: it.y + 28 }, g).textContent = `${it.type} ×${it.count}  ▸`;
    } else {
      UI.svgEl("rect", { x: it.x, y: it.y, width: it.w, height: it.h, rx: 6 }, g);
      UI.svgEl("text", { class: "l1", x: cx, y: it.y + 13 }, g).textContent = it.title;
      UI.svgEl("text", { class: "l2", x: cx, y: it.y + 28 }, g).textContent = it.line2;
    }
    if (worst) UI.svgEl("circle", { class: "ov-dot", cx: it.x + it.w - (it.kind === "fold" ? 14 : 8), cy: it.y + 8, r: 5, style: `fill: ${worst.fill}` }, g);
    return g;
  }

  // ----- overlay (graph_overlay.js) ------------------------------------------------------------
  const overlayOf = (label) => Overlay.paintOf(DATA, label);
  const worstInside = (cids) => Overlay.worstInside(DATA, model, cids);
  const drawLegend = () => Overlay.drawLegend($("legend"), DATA.overlay);


  function fit() {
    if (state.size) view2d.fit(state.size.width, state.size.height, { minK: 0.15, maxK: 1.3 });
  }

  /** Show the drawn items `its` (what was just opened) whole, centred: zoomed out as far as
   *  they need, and in no further than the scale the page starts at. */
  function fitItems(its) {
    if (!its.length) return;
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    for (const it of its) { x0 = Math.min(x0, it.x); y0 = Math.min(y0, it.y); x1 = Math.max(x1, it.x + it.w); y1 = Math.max(y1, it.y + it.h); }
    const box = svg.getBoundingClientRect(), pad = 40;
    const fitK = Math.min((box.width - pad) / Math.max(x1 - x0, 1), (box.height - pad) / Math.max(y1 - y0, 1));
    view2d.centerOn((x0 + x1) / 2, (y0 + y1) / 2, Math.min(1.3, Math.max(0.15, fitK)));
  }

  /** Keep the item that was clicked where it was on screen after a re-layout. */
  function anchored(id, after, change) {
    const before = state.tree && state.tree.items.get(id);
    const x0 = before ? before.x : null, y0 = before ? before.y : null;
    change();
    render(after.what);
    const now = after.ids.map((i) => state.tree.items.get(i)).find(Boolean);
    if (before && now) {
      state.zoom.x -= (now.x - x0) * state.zoom.k;
      state.zoom.y -= (now.y - y0) * state.zoom.k;
      view2d.apply();
    }
  }

  // ----- opening and closing --------------------------------------------------------------
  // opening a module (or a folded run) fits what it opened in view: anchoring the clicked
  // item instead left most of a big module off screen
  function expand(cid) {
    model.expanded[model.mode].add(cid);
    state.undo.push([["expand", cid]]);
    render(`expand ${cid}`);
    fitItems([state.tree.items.get(`b:${cid}`)].filter(Boolean));
  }

  function unfold(key, firstCid) {
    model.unfolded[model.mode].add(key);
    state.undo.push([["unfold", key]]);
    render(`unfold ${key}`);
    const m = model.view.modules[model.view.modules[firstCid].parent];
    const start = Number(key.slice(key.lastIndexOf("#") + 1));
    const fold = m.folds.find(([s0]) => s0 === start);
    const shown = (c) => state.tree.items.get(`m:${c}`) || state.tree.items.get(`b:${c}`) || state.tree.items.get(`n:${model.view.modules[c].single}`);
    fitItems(m.items.slice(start, start + (fold ? fold[1] : 1)).map(([, c]) => shown(c)).filter(Boolean));
  }

  function collapse(cid) {
    anchored(`b:${cid}`, { what: `collapse ${cid}`, ids: [`m:${cid}`] }, () => {
      model.expanded[model.mode].delete(cid);
      state.undo.push([["collapse", cid]]);
    });
  }

  function undo() {
    const actions = state.undo.pop();
    if (!actions) return false;
    for (const [kind, ref] of actions.reverse()) {
      if (kind === "expand") model.expanded[model.mode].delete(ref);
      if (kind === "collapse") model.expanded[model.mode].add(ref);
      if (kind === "unfold") model.unfolded[model.mode].delete(ref);
    }
    render("back");
    return true;
  }

  function setMode(mode) {
    if (mode === model.mode) return;
    model.mode = mode;
    state.selected = null;
    state.undo = [];
    closeDetails();
    if (!model.expanded[mode].size) chooseStartDepth();
    render(`mode ${mode}`);
    fit();
    runSearch(state.query, false);
  }

  /** The deepest level whose whole graph is readable in this window (folds stay folded). */
  function chooseStartDepth() {
    const budget = Math.max(14, Math.floor((svg.getBoundingClientRect().height || 600) / 50));
    let maxDepth = 0;
    for (const cid of Object.keys(model.view.modules)) if (cid) maxDepth = Math.max(maxDepth, model.depthOf(cid) + 1);
    let chosen = 0;
    for (let d = 0; d <= maxDepth; d++) {
      model.expandToDepth(d);
      const tree = model.build();
      let cost = 0;
      for (const it of tree.items.values()) cost += it.kind === "box" ? 2 : 1;
      if (cost > budget && d > 0) break;
      chosen = d;
    }
    model.expandToDepth(chosen);
  }

  // ----- selection and the details panel ----------------------------------------------------
  function select(n, center) {
    state.selected = n;
    markSelected();
    showDetails(n);
    if (center) {
      const it = state.tree.rep[n];
      if (it) view2d.centerOn(it.x + it.w / 2, it.y + it.h / 2, Math.max(state.zoom.k, 0.9));
    }
  }

  function markSelected() {
    svg.querySelectorAll(".selected").forEach((el) => el.classList.remove("selected"));
    svg.querySelectorAll(".edge.hot").forEach((el) => { el.classList.remove("hot"); el.setAttribute("marker-end", "url(#tl-arrow)"); });
    const it = state.selected === null ? null : state.tree.rep[state.selected];
    if (!it) return;
    const el = svg.querySelector(`[data-id="${CSS.escape(it.id)}"]`);
    if (el) el.classList.add("selected");
    for (const e of state.tree.edges) {
      if (e.a === it || e.b === it) { e.el.classList.add("hot"); e.el.setAttribute("marker-end", "url(#tl-arrow-hot)"); }
    }
  }

  function closeDetails() {
    const panel = $("details");
    panel.hidden = true;
    panel.textContent = "";
    state.selected = null;
    markSelected();
  }

  function goTo(label) {
    const n = nodeOfLabel(label);
    if (n === undefined) return;
    const opened = model.reveal({ node: n });
    if (opened.length) { state.undo.push(opened); render(`reveal ${label}`); }
    select(n, true);
  }

  /** Open the page on one operation: its modules opened (no undo step: it is the start). */
  function focusOn(label) {
    const n = nodeOfLabel(label);
    if (n === undefined) return;
    if (model.reveal({ node: n }).length) render(`focus ${label}`);
    select(n, true);
  }

  function showDetails(n) {
    const panel = $("details");
    const node = model.view.nodes[n], op = DATA.ops[node.op];
    panel.hidden = false;
    panel.textContent = "";
    const h = document.createElement("h3");
    h.innerHTML = "<span></span><button type=button title='close (Esc)'>×</button>";
    h.firstChild.textContent = node.label + (node.passes > 1 ? ` (${node.passes} passes)` : "");
    h.lastChild.onclick = closeDetails;
    panel.appendChild(h);
    const rows = [["type", op.type], ["function", op.func || "–"], ["shape", op.shape ? `(${op.shape.join(", ")})` : "–"],
      ["dtype", op.dtype || "–"], ["size", UI.humanBytes(op.nbytes)]];
    if (op.address) rows.push(["address", op.address]);
    if (op.modules && op.modules.length) rows.push(["module", op.modules.join(" › ")]);
    if (op.output_of && op.output_of.length) rows.push(["output of", op.output_of.join(", ")]);
    if (op.params.length) rows.push(["params", `${op.params.map(([a, s]) => `${a} (${s.join("×")})`).join(", ")}; ${op.num_params.toLocaleString()} in all`]);
    if (op.elapsed !== null && op.elapsed !== undefined) rows.push(["time", `${(op.elapsed * 1000).toFixed(3)} ms`]);
    if (node.passes > 1) rows.push(["passes", String(node.passes)]);
    else if (op.passes > 1) rows.push(["pass", `${op.pass} of ${op.passes}`]);
    if (op.grad_fn) rows.push(["grad_fn", op.grad_fn]);
    if (op.inplace) rows.push(["in-place", "yes"]);
    if (op.inside) rows.push(["created", "inside the model"]);
    if (op.note) rows.push(["note", op.note]);
    const paint = overlayOf(node.label);
    if (paint) rows.unshift([DATA.overlay.name, paint.text]);
    const line = sourceLine(op);
    if (line) rows.push(["source", line]);
    const table = document.createElement("table");
    for (const [k, v] of rows) { const tr = table.insertRow(); const a = tr.insertCell(); a.className = "key"; a.textContent = k; tr.insertCell().textContent = v; }
    panel.appendChild(table);
    if (op.stats && op.stats.min !== undefined) panel.appendChild(statsBlock(op.stats, node.passes > 1 ? "activation (pass 1)" : "activation"));
    else {  // saved but with no finite value has no range: say so, not "not saved"
      const text = op.stats && op.stats.n ? `no finite value (${op.stats.nonfinite.toLocaleString()} of ${op.stats.n.toLocaleString()} NaN/inf)` : "not saved";
      section(panel, "activation").after(Object.assign(document.createElement("div"), { textContent: text }));
    }
    if (op.attention && window.TorchlensGraphAttention) panel.appendChild(TorchlensGraphAttention.block(op.attention));
    links(panel, "parents", op.parents);
    links(panel, "children", op.children);
    const frames = op.stack || [];
    section(panel, "call stack");
    if (!frames.length) panel.appendChild(Object.assign(document.createElement("div"), { textContent: "–" }));
    for (const f of frames.map((i) => DATA.frames[i])) {
      const head = document.createElement("div");
      head.className = "frame";
      head.textContent = `${f.function} — ${f.file}:${f.line}`;
      const pre = document.createElement("pre");
      for (const line of f.code) {
        const span = document.createElement("span");
        span.textContent = line + "\n";
        if (line.startsWith("--->")) span.className = "here";
        pre.appendChild(span);
      }
      panel.append(head, pre);
    }
  }

  /** "file.py:12  code" of the innermost frame of the call stack (the line that called it). */
  function sourceLine(op) {
    const stack = op.stack || [];
    if (!stack.length) return null;
    const f = DATA.frames[stack[stack.length - 1]];
    const here = (f.code || []).find((l) => l.startsWith("--->"));
    const code = here ? here.replace(/^--->\s*(\d+\s*[:|]?)?\s*/, "").split("  #")[0].trim() : "";  // without a trailing comment
    return `${f.file.split("/").pop()}:${f.line}${code ? "  " + code : ""}`;
  }

  function section(panel, title) {
    const d = document.createElement("div");
    d.className = "sect";
    d.textContent = title;
    panel.appendChild(d);
    return d;
  }

  function links(panel, title, labels) {
    if (!labels || !labels.length) return;
    section(panel, title);
    const div = document.createElement("div");
    labels.forEach((label, i) => {
      if (i) div.append(", ");
      const a = document.createElement("a");
      a.textContent = label;
      a.dataset.goto = label;
      a.onclick = () => goTo(label);
      div.appendChild(a);
    });
    panel.appendChild(div);
  }

  function statsBlock(s, title) {
    const box = document.createElement("div");
    const head = document.createElement("div");
    head.className = "sect";
    head.textContent = title;
    box.appendChild(head);
    const table = document.createElement("table");
    table.dataset.role = "stats";
    const rows = [["min", UI.formatNumber(s.min)], ["max", UI.formatNumber(s.max)], ["mean", UI.formatNumber(s.mean)],
      ["std", UI.formatNumber(s.std)], ["zeros", `${(100 * s.zeros).toFixed(1)} %`], ["values", s.n.toLocaleString()]];
    if (s.nonfinite) rows.push(["NaN/inf", String(s.nonfinite)]);
    for (const [k, v] of rows) { const tr = table.insertRow(); const a = tr.insertCell(); a.className = "key"; a.textContent = k; tr.insertCell().textContent = v; }
    box.appendChild(table);
    const W = 300, H = 60, hist = s.hist || [];
    const peak = Math.max(1, ...hist);
    const chart = UI.svgEl("svg", { class: "hist", width: W, height: H + 12, "data-role": "histogram" });
    const bw = W / Math.max(hist.length, 1);
    hist.forEach((c, i) => {
      const h = c ? Math.max(1, (H * c) / peak) : 0;
      UI.svgEl("rect", { x: i * bw + 0.5, y: H - h, width: Math.max(bw - 1, 1), height: h }, chart);
    });
    if (s.min < 0 && s.max > 0) {
      const x0 = (W * -s.min) / (s.max - s.min);
      UI.svgEl("line", { x1: x0, x2: x0, y1: 0, y2: H }, chart);
    }
    const lo = UI.svgEl("text", { x: 0, y: H + 10, "font-size": 9, fill: "#667" }, chart);
    lo.textContent = UI.formatNumber(s.min);
    const hi = UI.svgEl("text", { x: W, y: H + 10, "font-size": 9, fill: "#667", "text-anchor": "end" }, chart);
    hi.textContent = UI.formatNumber(s.max);
    box.appendChild(chart);
    return box;
  }

  // ----- tooltips ----------------------------------------------------------------------------
  function tooltipRows(it) {
    if (it.kind === "op") {
      const node = model.view.nodes[it.node], op = DATA.ops[node.op];
      const rows = [["type", op.type], ["shape", op.shape ? `(${op.shape.join(", ")})` : "–"], ["dtype", op.dtype || "–"], ["size", UI.humanBytes(op.nbytes)]];
      if (op.num_params) rows.push(["params", op.num_params.toLocaleString()]);
      if (op.modules && op.modules.length) rows.push(["module", op.modules[op.modules.length - 1]]);
      if (op.elapsed !== null && op.elapsed !== undefined) rows.push(["time", `${(op.elapsed * 1000).toFixed(3)} ms`]);
      if (node.passes > 1) rows.push(["passes", String(node.passes)]);
      const paint = overlayOf(node.label);
      if (paint) rows.unshift([DATA.overlay.name, paint.text]);
      if (op.stats && op.stats.min !== undefined) rows.push(["range", `${UI.formatNumber(op.stats.min)} … ${UI.formatNumber(op.stats.max)}`], ["mean ± std", `${UI.formatNumber(op.stats.mean)} ± ${UI.formatNumber(op.stats.std)}`]);
      return [it.label, rows];
    }
    const m = model.view.modules[it.cid];
    const members = it.kind === "fold" ? it.members : [it.cid];
    let ops = 0;
    for (const c of members) ops += model.view.modules[c].ops;
    if (m.group) return [it.title, [["tensors", String(m.ops)], ["§", "click to open"]]];
    const rows = [["type", m.type], ["operations", String(ops)]];
    if (it.kind === "fold") rows.push(["repeated", `${it.count} calls with the same inside`]);
    if (m.passes > 1) rows.push(["calls", `${m.passes} in this pass`]);
    rows.push(["§", "click to " + (it.kind === "fold" ? "unfold" : "open")]);
    return [it.title, rows];
  }

  // ----- search ------------------------------------------------------------------------------
  function findMatches(query) {
    const q = query.trim().toLowerCase();
    if (!q) return { nodes: [], module: null };
    const view = model.view;
    let module = null;
    for (const [cid, m] of Object.entries(view.modules)) {
      if (cid && (cid.toLowerCase() === q || m.address.toLowerCase() === q)) { module = cid; break; }
    }
    const exact = [], rest = [];
    view.nodes.forEach((node, i) => {
      const op = DATA.ops[node.op];
      const label = node.label.toLowerCase();
      if (label === q || op.label.toLowerCase() === q) exact.push(i);
      else if (label.includes(q) || op.type === q || (op.modules || []).some((a) => { const s = a.toLowerCase(); return s === q || s.startsWith(q + ".") || s.startsWith(q + ":"); })) rest.push(i);
    });
    return { nodes: exact.concat(rest), module };
  }

  function markMatches() {
    svg.querySelectorAll(".match, .has-match").forEach((el) => el.classList.remove("match", "has-match"));
    if (!state.tree) return;
    for (const n of state.matches) {
      const it = state.tree.rep[n];
      const el = it && svg.querySelector(`[data-id="${CSS.escape(it.id)}"]`);
      if (el) el.classList.add(it.kind === "op" ? "match" : "has-match");
    }
    if (state.moduleMatch) {
      const el = svg.querySelector(`[data-id="${CSS.escape(`m:${state.moduleMatch}`)}"]`) || svg.querySelector(`[data-cid="${CSS.escape(state.moduleMatch)}"]`);
      if (el) el.classList.add("match");
    }
  }

  /** Show the matches of `query`; with `jump`, go to the next one: Enter steps through the
   *  module of that address (when no operation has that very label) and then the operations,
   *  a new query starting again from its first. */
  function runSearch(query, jump) {
    $("tooltip").hidden = true;  // the card of what the mouse was over no longer fits what is shown
    if (!jump || query !== state.query) state.matchAt = -1;
    state.query = query;
    const found = findMatches(query);
    state.matches = found.nodes;
    state.moduleMatch = found.module;
    const count = found.nodes.length + (found.module ? 1 : 0);
    $("matches").textContent = query.trim() ? `${count} match${count === 1 ? "" : "es"}` : "";
    markMatches();
    if (!jump || !count) return;
    const q = query.trim().toLowerCase();
    const moduleFirst = found.module && !found.nodes.some((n) => model.view.nodes[n].label.toLowerCase() === q) ? 1 : 0;
    const stops = found.nodes.length + moduleFirst;
    state.matchAt = (state.matchAt + 1) % stops;
    if (moduleFirst && state.matchAt === 0) {
      const opened = model.reveal({ module: found.module });
      if (opened.length) state.undo.push(opened);
      render(`search ${query}`);
      const it = state.tree.items.get(`m:${found.module}`) || state.tree.items.get(`b:${found.module}`);
      if (it) view2d.centerOn(it.x + it.w / 2, it.y + it.h / 2, Math.max(state.zoom.k, 0.8));
      $("matches").textContent = `1 of ${stops}`;
      return;
    }
    const n = found.nodes[state.matchAt - moduleFirst];
    const opened = model.reveal({ node: n });
    if (opened.length) { state.undo.push(opened); render(`search ${query}`); }
    $("matches").textContent = `${state.matchAt + 1} of ${stops}`;
    select(n, true);
  }

  // ----- events ------------------------------------------------------------------------------
  function itemOf(target) {
    const el = target.closest(".item");
    return el && state.tree ? state.tree.items.get(el.dataset.id) : null;
  }

  function setupEvents() {
    let down = null;
    svg.addEventListener("pointerdown", (event) => { down = { x: event.clientX, y: event.clientY }; });
    svg.addEventListener("click", (event) => {
      if (down && Math.hypot(event.clientX - down.x, event.clientY - down.y) > 4) return;  // a pan, not a click
      const head = event.target.closest("[data-collapse]");
      if (head) { collapse(head.dataset.collapse); return; }
      const it = itemOf(event.target);
      if (!it) return;
      $("tooltip").hidden = true;
      if (it.kind === "op") select(it.node, false);
      else if (it.kind === "module") expand(it.cid);
      else if (it.kind === "fold") unfold(it.key, it.cid);
    });
    svg.addEventListener("mouseover", (event) => {
      const it = itemOf(event.target);
      const tip = $("tooltip");
      if (!it) { tip.hidden = true; return; }
      const [title, rows] = tooltipRows(it);
      UI.fillTable(tip, title, rows);
      tip.hidden = false;
      UI.placeFloating(tip, event);
    });
    svg.addEventListener("mousemove", (event) => { const tip = $("tooltip"); if (!tip.hidden) UI.placeFloating(tip, event); });
    svg.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
    const box = $("search");
    let timer = null;
    box.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => runSearch(box.value, false), 120); });
    box.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { clearTimeout(timer); event.preventDefault(); runSearch(box.value, true); }
    });
    document.addEventListener("keydown", (event) => {
      const typing = event.target instanceof HTMLInputElement && event.target.type !== "radio";
      if (event.key === "/" && !typing) { event.preventDefault(); box.focus(); box.select(); return; }
      if (event.key !== "Escape") return;
      $("tooltip").hidden = true;
      if (typing) { box.value = ""; runSearch("", false); box.blur(); return; }
      if (!$("details").hidden) { closeDetails(); return; }
      undo();
    });
    $("fit").onclick = fit;
    $("expand-all").onclick = () => { model.expandAll(); state.undo = []; render("expand all"); fit(); };
    $("collapse-all").onclick = () => { model.collapseAll(); state.undo = []; render("collapse all"); fit(); };
    for (const radio of document.querySelectorAll('[name="tl-mode"]')) radio.onchange = () => setMode(radio.value);
    window.addEventListener("resize", () => { if (state.tree) fit(); });
  }

  function start() {
    const title = $("title");
    const s = DATA.summary;
    title.textContent = DATA.model;
    const sub = document.createElement("span");
    sub.className = "sub";
    sub.textContent = ` · ${s.num_tensors} tensors · ${s.num_params.toLocaleString()} params · ${UI.humanBytes(s.tensor_bytes)}`;
    title.appendChild(sub);
    if (s.max_passes > 1) $("mode").hidden = false;
    setupEvents();
    chooseStartDepth();
    render("start");
    fit();
    drawLegend();
    if (DATA.focus) focusOn(DATA.focus);
    document.body.dataset.ready = "1";
  }

  try {
    start();
  } catch (error) {
    const box = $("error");
    box.textContent = `The graph could not be drawn: ${error.message}`;
    box.hidden = false;
    throw error;
  }
})();
