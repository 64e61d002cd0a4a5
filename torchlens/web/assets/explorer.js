/* torchlens explorer page: the module graph of one call on the left (click to open a node,
 * breadcrumbs to go back up), pinned histogram panels on the right (drag a node there).
 * Data comes from the JSON routes of torchlens/explorer/server.py, or, in an exported file,
 * from window.TORCHLENS_EXPORT (same shapes). Shared helpers come from common.js (window.TorchlensUI).
 * No library, no network beyond the page's server. */
(function () {
  "use strict";

  const EXPORTED = window.TORCHLENS_EXPORT || null;
  // a notebook's live view: the kernel pushes new steps into EXPORTED (live.js); polled locally
  const LIVE = Boolean(EXPORTED && EXPORTED.live);
  const POLL_MS = LIVE ? 400 : 2000;
  const KIND_ORDER = ["io", "io_grad", "params", "params_grad", "updates"];
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#e6550d", "#bcbd22"];
  const $ = (role) => document.querySelector(`[data-role="${role}"]`);
  const UI = window.TorchlensUI;  // common.js, shared with the graph page

  const state = {
    runId: null,        // id from /api/runs
    summary: null,      // /api/run
    view: "",           // the call whose inside is shown
    panels: [],         // pinned call ids, in order
    series: {},         // call id -> {seriesKey -> series}
    lastStep: -1,
    stride: 1,
    numCalls: 0,
    zoom: { k: 1, x: 0, y: 0 },
  };

  // ----- data ------------------------------------------------------------------------------
  async function api(route, params) {
    if (EXPORTED) return exportedAnswer(route, params || {});
    const query = new URLSearchParams();
    if (state.runId !== null && route !== "runs") query.set("run", state.runId);
    for (const [k, v] of Object.entries(params || {})) query.set(k, v);
    const response = await fetch(`/api/${route}?${query}`, { cache: "no-store" });
    const body = await response.json().catch(() => ({ error: `bad answer from the server (${response.status})` }));
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    return body;
  }

  function exportedAnswer(route, params) {
    // one run: {summary, layouts, call_series}; a folder of runs: {runs, run_data: {id: one run}}
    if (route === "runs") {
      if (EXPORTED.runs) return { runs: EXPORTED.runs };
      return { runs: [{ id: ".", name: EXPORTED.summary.model, model: EXPORTED.summary.model }] };
    }
    const data = EXPORTED.runs ? EXPORTED.run_data[state.runId] : EXPORTED;
    if (!data) {
      const entry = EXPORTED.runs.find((r) => r.id === state.runId);
      throw new Error(entry && entry.error ? entry.error : `no run ${state.runId} in this file`);
    }
    // copies: the page extends what it is given, and a live view's data keeps changing under it
    if (route === "run") return structuredClone(data.summary);
    if (route === "poll") {
      const all = data.summary.steps, steps = all.filter((st) => st > (params.since ?? -1));
      return {
        steps, num_steps: all.length, last_step: all.length ? all[all.length - 1] : -1,
        stride: data.summary.stride, status: data.summary.status, num_calls: Object.keys(data.summary.calls).length,
      };
    }
    if (route === "layout") {
      if (!(params.call in data.layouts)) throw new Error(`no layout for ${params.call}`);
      return data.layouts[params.call];
    }
    if (route === "call_series") return structuredClone(data.call_series[params.call] || { call: params.call, series: [] });
    throw new Error(`unknown route ${route}`);
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  // ----- the address bar keeps the view and the panels (a reload restores them) -------------
  function saveState() {
    const hash = new URLSearchParams();
    if (state.runId && state.runId !== ".") hash.set("run", state.runId);
    if (state.view) hash.set("view", state.view);
    if (state.panels.length) hash.set("panels", state.panels.join("|"));
    if (state.compare) hash.set("compare", state.compare);  // the second run (tworuns.js)
    const text = hash.toString();
    try {
      history.replaceState(null, "", text ? `#${text}` : location.pathname + location.search);
    } catch (e) { /* embedded in a notebook (iframe srcdoc): the page has no URL of its own to keep the view in */ }
    try { localStorage.setItem(storageKey(), JSON.stringify({ view: state.view, panels: state.panels })); } catch (e) { /* private mode */ }
  }

  function storageKey() { return `torchlens:${location.pathname}:${state.runId}:${state.summary ? state.summary.model : ""}`; }

  function loadState() {
    const hash = new URLSearchParams(location.hash.slice(1));
    if (hash.has("view") || hash.has("panels")) {
      state.view = hash.get("view") || "";
      state.panels = (hash.get("panels") || "").split("|").filter(Boolean);
      return;
    }
    try {
      const saved = JSON.parse(localStorage.getItem(storageKey()) || "null");
      if (saved) { state.view = saved.view || ""; state.panels = saved.panels || []; }
    } catch (e) { /* nothing saved */ }
  }

  // ----- runs --------------------------------------------------------------------------------
  async function start() {
    try {
      const answer = await api("runs"), runs = answer.runs;
      if (!runs.length) throw new Error("No torchlens run in this folder yet.");
      const wanted = new URLSearchParams(location.hash.slice(1)).get("run") || (answer.pair || [])[0];
      const picker = $("run-picker");
      if (runs.length > 1) {
        picker.hidden = false;
        picker.innerHTML = "";
        for (const r of runs) {
          const option = document.createElement("option");
          option.value = r.id;
          option.textContent = `${r.name} — ${r.model || "?"}${r.error ? " (unreadable)" : ` (${r.steps} steps)`}`;
          picker.appendChild(option);
        }
        picker.onchange = () => openRun(picker.value, true).catch((error) => showError(error.message));
      }
      const first = runs.find((r) => r.id === wanted) || runs[runs.length - 1];
      picker.value = first.id;
      await openRun(first.id, false);
    } catch (error) {
      showError(error.message);
    }
  }

  async function openRun(runId, fresh) {
    state.runId = runId;
    state.series = {};
    try {
      state.summary = await api("run");
    } catch (error) {  // an unreadable run: nothing of the previous one stays on screen
      state.summary = null;
      state.panels = [];
      for (const role of ["graph-svg", "breadcrumbs", "panels"]) $(role).innerHTML = "";
      $("status").textContent = "";
      renderEmptyHint();
      throw error;
    }
    state.lastStep = state.summary.steps.length ? state.summary.steps[state.summary.steps.length - 1] : -1;
    state.stride = state.summary.stride;
    state.numCalls = Object.keys(state.summary.calls).length;
    if (fresh) { state.view = ""; state.panels = []; } else loadState();
    if (!(state.view in state.summary.calls)) state.view = "";
    state.panels = state.panels.filter((c) => c in state.summary.calls);
    showError("");
    fillSearch();
    updateStatus();
    await showCall(state.view);
    document.querySelector('[data-role="panels"]').innerHTML = "";
    const pinned = state.panels;
    state.panels = [];
    for (const cid of pinned) await pin(cid);
    renderEmptyHint();
    saveState();
    if ((!EXPORTED || LIVE) && !state.polling) { state.polling = true; setTimeout(poll, POLL_MS); }
  }

  function updateStatus() {
    const s = state.summary;
    const n = s.steps.length;
    const last = n ? s.steps[n - 1] : "–";
    $("status").textContent = `${s.model} · ${n} logged step${n === 1 ? "" : "s"} (last ${last}) · ${s.status}`;
  }

  // ----- the graph ---------------------------------------------------------------------------
  const callOf = (cid) => state.summary.calls[cid];

  function displayName(cid) {
    const call = callOf(cid);
    if (!call) return cid;
    if (cid === "") return state.summary.model;
    const parts = call.address.split(".");
    const sameModule = Object.keys(state.summary.calls).filter((c) => callOf(c).address === call.address).length;
    return parts[parts.length - 1] + (sameModule > 1 ? ` (${cid.split(":").pop()})` : "");
  }

  function crumbName(cid) {
    // the full address: '0' alone says nothing when every block has a '0'
    const call = callOf(cid);
    if (!call || cid === "") return displayName(cid);
    const calls = Object.keys(state.summary.calls).filter((c) => callOf(c).address === call.address).length;
    return call.address + (calls > 1 ? ` (${cid.split(":").pop()})` : "");
  }

  async function showCall(cid) {
    const started = performance.now();
    state.view = cid;
    renderCrumbs();
    let layout;
    try {
      layout = await api("layout", { call: cid });
    } catch (error) {
      showError(error.message);
      return;
    }
    drawGraph(layout);
    fitGraph(layout);
    saveState();
    window.__torchlensTimings = window.__torchlensTimings || [];
    window.__torchlensTimings.push({ call: cid, ms: performance.now() - started });
  }

  function renderCrumbs() {
    const nav = $("breadcrumbs");
    nav.innerHTML = "";
    const chain = [];
    for (let c = state.view; c !== null && c !== undefined; c = callOf(c) ? callOf(c).parent : null) chain.unshift(c);
    chain.forEach((c, i) => {
      if (i) { const sep = document.createElement("span"); sep.className = "sep"; sep.textContent = "›"; nav.appendChild(sep); }
      const a = document.createElement("a");
      a.dataset.crumb = c;
      a.textContent = crumbName(c);
      if (callOf(c)) a.title = callOf(c).class_name;
      if (i === chain.length - 1) a.className = "here";
      a.onclick = () => showCall(c);
      nav.appendChild(a);
    });
  }

  function drawGraph(layout) {
    const svg = $("graph-svg");
    svg.innerHTML = "";
    UI.arrowMarker(svg, "arrow", "#8896a5");
    const root = UI.svgEl("g", { "data-role": "graph-root" }, svg);
    for (const e of layout.edges) UI.svgEl("path", { class: "edge", d: UI.edgePath(e.points, e.spline), "marker-end": "url(#arrow)", "data-edge": `${e.from}→${e.to}` }, root);
    for (const n of layout.nodes) {
      const g = UI.svgEl("g", { class: `node ${n.kind}${n.has_inside ? " has-inside" : ""}`, "data-node": n.id, transform: `translate(${n.x - n.w / 2},${n.y - n.h / 2})` }, root);
      UI.svgEl("rect", { width: n.w, height: n.h, rx: n.kind === "call" ? 6 : 14 }, g);
      if (n.kind === "call") {
        UI.svgEl("text", { x: n.w / 2, y: n.h / 2 - 8 }, g).textContent = n.label;
        UI.svgEl("text", { class: "cls", x: n.w / 2, y: n.h / 2 + 9 }, g).textContent = n.class_name + (n.has_inside ? " ▸" : "");
      } else {
        UI.svgEl("text", { x: n.w / 2, y: n.h / 2 }, g).textContent = n.label;
      }
      attachNodeEvents(g, n);
    }
    markPinned();
    document.dispatchEvent(new CustomEvent("torchlens:graph"));  // health.js badges the nodes
  }

  function fitGraph(layout) {
    state.view2d.fit(layout.width, layout.height, { minK: 0.05 });
  }

  function setupZoomAndPan() {
    state.view2d = UI.zoomPan($("graph-svg"), () => document.querySelector('[data-role="graph-root"]'), state.zoom,
      (target) => target.closest(".node"));
  }

  // ----- nodes: tooltip, click, drag to pin -----------------------------------------------------
  function attachNodeEvents(g, node) {
    g.addEventListener("mouseenter", (event) => showTooltip(node, event));
    g.addEventListener("mousemove", (event) => UI.placeFloating($("tooltip"), event));
    g.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
    g.addEventListener("pointerdown", (event) => startNodeDrag(event, node));
  }

  function panelTarget(node) {
    // inputs and outputs of the viewed call are that call's own series
    return node.kind === "call" ? node.id : state.view;
  }

  function startNodeDrag(event, node) {
    event.preventDefault();
    const start = { x: event.clientX, y: event.clientY };
    let ghost = null;
    const panels = $("panels");
    const overPanels = (e) => {
      const r = panels.getBoundingClientRect();
      return e.clientX >= r.left && e.clientX <= r.right && e.clientY >= r.top && e.clientY <= r.bottom;
    };
    const move = (e) => {
      if (!ghost && Math.hypot(e.clientX - start.x, e.clientY - start.y) > 5) {
        ghost = document.createElement("div");
        ghost.className = "drag-ghost";
        ghost.textContent = node.kind === "call" ? displayName(node.id) : `${displayName(state.view)} (${node.id})`;
        document.body.appendChild(ghost);
        $("tooltip").hidden = true;
      }
      if (ghost) {
        ghost.style.left = `${e.clientX + 8}px`;
        ghost.style.top = `${e.clientY + 8}px`;
        panels.classList.toggle("drop-target", overPanels(e));
      }
    };
    const up = (e) => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      panels.classList.remove("drop-target");
      if (ghost) {
        ghost.remove();
        if (overPanels(e)) pin(panelTarget(node), true);
      } else if (node.kind === "call" && node.has_inside) {
        showCall(node.id);
      }
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  function splitTopLevel(text) {
    const parts = [];
    let depth = 0, current = "";
    for (const ch of text) {
      if ("([{".includes(ch)) depth++;
      if (")]}".includes(ch)) depth--;
      if (ch === "," && depth === 0) { parts.push(current.trim()); current = ""; } else current += ch;
    }
    if (current.trim()) parts.push(current.trim());
    return parts;
  }

  function extraReprRows(text) {
    return splitTopLevel(text || "").map((part) => {
      const at = part.indexOf("=");
      return at > 0 ? [part.slice(0, at).trim(), part.slice(at + 1).trim()] : ["-", part];
    });
  }

  function showTooltip(node, event) {
    const tip = $("tooltip");
    const rows = [];
    let title;
    if (node.kind === "call") {
      const call = callOf(node.id);
      title = `${call.address} · ${call.class_name} · call ${node.id.split(":").pop()}`;
      for (const [name, shape] of call.inputs) rows.push([name, `[${shape.join(", ")}]`]);
      for (const [name, shape] of call.outputs) rows.push([name, `[${shape.join(", ")}]`]);
      // named by the constructor's signature on the Python side; runs written before: parsed here
      const extra = call.arguments && call.arguments.length ? call.arguments : extraReprRows(call.extra_repr);
      if (extra.length) rows.push(["§", "module"], ...extra);
      if (call.params && call.params.length) rows.push(["§", "parameters"], ...call.params.map(([n, s]) => [n, `[${s.join(", ")}]`]));
    } else if (node.members) {  // the many tensors of one container (a cache), folded into one node
      title = `${node.label} of ${displayName(state.view)}`;
      for (const [name, shape] of node.members) rows.push([name, `[${shape.join(", ")}]`]);
    } else {
      title = `${node.id} of ${displayName(state.view)}`;
      rows.push(["shape", `[${(node.shape || []).join(", ")}]`]);
    }
    UI.fillTable(tip, title, rows);
    tip.hidden = false;
    UI.placeFloating(tip, event);
  }

  // ----- search ----------------------------------------------------------------------------------
  function fillSearch() {
    const list = document.getElementById("tl-addresses");
    list.innerHTML = "";
    const seen = new Set();
    for (const call of Object.values(state.summary.calls)) {
      if (!call.address || seen.has(call.address)) continue;
      seen.add(call.address);
      const option = document.createElement("option");
      option.value = call.address;
      list.appendChild(option);
    }
    const box = $("search");
    box.onchange = () => findModule(box.value.trim());
    box.onkeydown = (event) => { if (event.key === "Enter") findModule(box.value.trim()); };
  }

  async function findModule(text) {
    if (!text) return;
    const calls = state.summary.calls;
    const cid = text in calls ? text : Object.keys(calls).find((c) => calls[c].address === text)
      || Object.keys(calls).find((c) => calls[c].address.endsWith(text));
    if (cid === undefined) { showError(`No module called '${text}' ran in this model.`); return; }
    showError("");
    const parent = cid === "" ? "" : calls[cid].parent;
    if (parent !== state.view) await showCall(parent === null ? "" : parent);
    const el = document.querySelector(`[data-node="${CSS.escape(cid)}"]`);
    if (el) {
      el.classList.add("found");
      setTimeout(() => el.classList.remove("found"), 2500);
    }
  }

  // ----- panels and heat strips ----------------------------------------------------------------
  function colorOf(cid) {
    let h = 0;
    for (const ch of cid) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
    return COLORS[h % COLORS.length];
  }

  function markPinned() {
    document.querySelectorAll(".node").forEach((el) => {
      const id = el.dataset.node;
      const pinned = state.panels.includes(id);
      el.classList.toggle("pinned", pinned);
      if (pinned) el.style.setProperty("--pin", colorOf(id)); else el.style.removeProperty("--pin");
    });
  }

  function renderEmptyHint() {
    const column = $("panels");
    const hint = column.querySelector(".empty");
    if (!state.panels.length && !hint) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "Drag a node here to see its histograms over training.";
      column.appendChild(p);
    } else if (state.panels.length && hint) hint.remove();
  }

  function seriesKey(s) { return `${s.kind}/${s.name}`; }

  function sortSeries(list) {
    const rank = (s) => {
      const attached = s.kind.startsWith("io") && !/^(input|output) /.test(s.name);
      return KIND_ORDER.indexOf(s.kind) * 2 + (attached ? 1 : 0);
    };
    return list.slice().sort((a, b) => rank(a) - rank(b));
  }

  // a pin made by the user is scrolled to the top of the column: it would else land below the
  // panels already there, out of sight
  function reveal(panel) {
    const column = $("panels");
    column.scrollTop += panel.getBoundingClientRect().top - column.getBoundingClientRect().top - 8;
    panel.classList.add("fresh");
    setTimeout(() => panel.classList.remove("fresh"), 1200);
  }

  async function pin(cid, byUser) {
    if (state.panels.includes(cid) || !(cid in state.summary.calls)) return;
    state.panels.push(cid);
    saveState();
    markPinned();
    renderEmptyHint();
    const call = callOf(cid);
    const panel = document.createElement("div");
    panel.className = "panel";
    panel.dataset.panel = cid;
    panel.style.setProperty("--pin", colorOf(cid));
    const h = document.createElement("h3");
    const title = document.createElement("span");
    title.innerHTML = `<span></span> <span class="cls"></span>`;
    title.firstChild.textContent = cid === "" ? state.summary.model : call.address + (cid.endsWith(":1") ? "" : ` (call ${cid.split(":").pop()})`);
    title.lastChild.textContent = call.class_name;
    const close = document.createElement("button");
    close.className = "close";
    close.title = "close";
    close.textContent = "×";
    close.onclick = () => unpin(cid);
    h.append(title, close);
    panel.appendChild(h);
    $("panels").appendChild(panel);
    try {
      const answer = await api("call_series", { call: cid });
      state.series[cid] = {};
      for (const s of answer.series) state.series[cid][seriesKey(s)] = s;
      renderPanel(cid);
      if (byUser) reveal(panel);
    } catch (error) {
      const p = document.createElement("p");
      p.textContent = `Cannot load histograms: ${error.message}`;
      panel.appendChild(p);
    }
  }

  function unpin(cid) {
    state.panels = state.panels.filter((c) => c !== cid);
    delete state.series[cid];
    const panel = document.querySelector(`[data-panel="${CSS.escape(cid)}"]`);
    if (panel) panel.remove();
    markPinned();
    renderEmptyHint();
    saveState();
  }

  function renderPanel(cid) {
    const panel = document.querySelector(`[data-panel="${CSS.escape(cid)}"]`);
    if (!panel) return;
    const list = sortSeries(Object.values(state.series[cid] || {}));
    if (!list.length && !panel.querySelector(".none")) {
      const p = document.createElement("p");
      p.className = "none";
      p.textContent = "No histograms recorded for this call yet.";
      panel.appendChild(p);
    }
    for (const s of list) {
      const key = seriesKey(s);
      let canvas = panel.querySelector(`canvas[data-series="${CSS.escape(key)}"]`);
      if (!canvas) {
        const none = panel.querySelector(".none");
        if (none) none.remove();
        const box = document.createElement("div");
        box.className = "strip";
        box.innerHTML = `<div class="label"><span class="kind"></span> <span class="name"></span></div>`;
        box.querySelector(".kind").textContent = s.kind.replace("_", " ");
        box.querySelector(".name").textContent = s.name;
        canvas = document.createElement("canvas");
        canvas.dataset.series = key;
        box.appendChild(canvas);
        const line = document.createElement("canvas");  // the summary line under the strip
        line.className = "line";
        line.dataset.line = key;
        box.appendChild(line);
        panel.appendChild(box);
        for (const c of [canvas, line]) {
          c.addEventListener("mousemove", (event) => stripHover(event, c, cid, key));
          c.addEventListener("mouseleave", () => { $("strip-tip").hidden = true; });
        }
      }
      // a series without values says why, in place of its strip
      const box = canvas.parentElement;
      let why = box.querySelector(".reason");
      if (!s.steps.length && s.reason) {
        if (!why) { why = document.createElement("p"); why.className = "reason"; box.appendChild(why); }
        why.textContent = s.reason;
        canvas.hidden = true;
      } else {
        if (why) why.remove();
        canvas.hidden = false;
        drawStrip(canvas, s);
      }
      const line = box.querySelector("canvas.line");
      line.hidden = !s.steps.length || !(s.line || []).some((v) => v !== null);
      if (!line.hidden) window.TorchlensStrips.drawLine(line, s, format);
    }
    document.dispatchEvent(new CustomEvent("torchlens:panel", { detail: { cid } }));  // tworuns.js adds the other run
  }

  const MARGIN = window.TorchlensStrips.MARGIN;
  const format = UI.formatNumber;
  const drawStrip = (canvas, s) => window.TorchlensStrips.draw(canvas, s, format);

  function stripHover(event, canvas, cid, key) {
    const s = (state.series[cid] || {})[key];
    const tip = $("strip-tip");
    if (!s || !s.steps.length) { tip.hidden = true; return; }
    const box = canvas.getBoundingClientRect();
    const plotW = box.width - MARGIN.left - MARGIN.right;
    const i = Math.floor(((event.clientX - box.left - MARGIN.left) / plotW) * s.steps.length);
    if (i < 0 || i >= s.steps.length) { tip.hidden = true; return; }
    const steps = s.steps[i] === s.last_steps[i] ? `step ${s.steps[i]}` : `steps ${s.steps[i]}–${s.last_steps[i]}`;
    const total = s.counts[i].reduce((a, b) => a + b, 0);
    tip.textContent = `${steps} · histogram [${format(s.lo[i])}, ${format(s.hi[i])}] · ${Math.round(total)} sampled` + (s.nonfinite[i] ? ` · ${s.nonfinite[i]} NaN/inf` : "") + exactText(s, i);
    tip.hidden = false;
    UI.placeFloating(tip, event);
  }

  // what the hover says about all values of column i (absent in runs written before)
  function exactText(s, i) {
    if (!s.count || s.count[i] === null || s.count[i] === undefined) return "";
    const parts = [`all ${Math.round(s.count[i])} values: [${format(s.true_min[i])}, ${format(s.true_max[i])}]`];
    parts.push(`mean ${format(s.mean[i])}`, `std ${format(s.std[i])}`);
    for (const [field, label] of [["nan", "NaN"], ["posinf", "+inf"], ["neginf", "−inf"], ["zeros", "zeros"]]) {
      if (s[field][i]) parts.push(`${Math.round(s[field][i])} ${label}`);
    }
    if (s.line[i] !== null && s.line_label && s.line_label !== "std") parts.push(`${s.line_label} ${format(s.line[i])}`);
    return "\n" + parts.join(" · ");
  }

  // ----- live updates: ask what is new, fetch only new columns ---------------------------------
  async function poll() {
    if (!state.summary) { setTimeout(poll, POLL_MS); return; }  // the open run is unreadable
    try {
      const news = await api("poll", { since: state.lastStep });
      const held = state.summary.steps.length;
      // The counts are the server's: steps sent are added only after the last one held, and a page
      // whose steps then disagree with the server's count (answers that overlapped, a run changed
      // under it) takes the whole summary again, which is newer than this answer.
      const last = held ? state.summary.steps[held - 1] : -1;
      state.summary.steps.push(...news.steps.filter((st) => st > last));
      state.summary.status = news.status;
      state.summary.stride = news.stride;
      const miscounted = news.num_steps !== undefined && state.summary.steps.length !== news.num_steps;
      if (news.num_calls !== state.numCalls || miscounted) {
        const callsBefore = state.numCalls;
        state.summary = await api("run");
        state.numCalls = Object.keys(state.summary.calls).length;
        if (state.numCalls !== callsBefore) { fillSearch(); await showCall(state.view); }
      }
      const steps = state.summary.steps;
      state.lastStep = steps.length ? steps[steps.length - 1] : -1;
      const restart = state.summary.stride !== state.stride;
      if (steps.length !== held || restart) {
        state.stride = state.summary.stride;
        for (const cid of state.panels) await refreshPanel(cid, restart);
      }
      updateStatus();
      showError("");
    } catch (error) {
      showError(`Lost contact with the run: ${error.message.replace(/\.$/, "")}. Retrying…`);
    }
    setTimeout(poll, POLL_MS);
  }

  async function refreshPanel(cid, restart) {
    const known = state.series[cid] || {};
    let since = null;
    if (!restart) {
      for (const s of Object.values(known)) if (s.steps.length) since = Math.max(since === null ? -Infinity : since, s.last_steps[s.last_steps.length - 1]);
    }
    const answer = await api("call_series", since === null ? { call: cid } : { call: cid, since });
    state.series[cid] = window.TorchlensStrips.merge(restart ? {} : known, answer.series);
    renderPanel(cid);
  }

  window.addEventListener("resize", () => { for (const cid of state.panels) renderPanel(cid); });
  window.TorchlensExplorer = { state, api, showCall, pin, reveal, saveState };  // for health.js, tworuns.js
  setupZoomAndPan();
  start();
})();
