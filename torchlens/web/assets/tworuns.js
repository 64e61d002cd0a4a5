/* torchlens explorer: two runs side by side. A second picker ("compare with") chooses another
 * run of the served folder (`torchlens explore RUN_A RUN_B` chooses it itself); then every pinned
 * call shows, under each strip of the open run, the same series of the other run (calls and
 * series matched by id and name), both on one step axis and labelled with their run's name.
 * Where Run.compare finds a series first differs, both strips carry a red dashed line at that
 * step. A box at the top of the panels lists the calls only one run has.
 * Data: GET /api/pair (server.py, pair.py) and /api/call_series of the other run. Works through
 * window.TorchlensExplorer and its "torchlens:graph" / "torchlens:panel" events; an exported
 * file has no second run, so nothing here runs there. */
(function () {
  "use strict";

  if (window.TORCHLENS_EXPORT) return;
  const REFETCH_MS = 3000;  // a pinned panel refreshed by polling re-asks the other run this often
  const $ = (role) => document.querySelector(`[data-role="${role}"]`);
  const app = () => window.TorchlensExplorer;
  const Strips = () => window.TorchlensStrips;
  const pair = { runId: undefined, other: "", info: null, series: {}, asked: {}, runs: [] };
  // read now: the page rewrites its address as it opens the run, before the second run is chosen
  const asked = new URLSearchParams(location.hash.slice(1)).get("compare");

  // ----- choosing the other run ----------------------------------------------------------------
  async function runChanged() {
    const ex = app();
    if (!ex.state.summary || ex.state.runId === pair.runId) return;
    const first = pair.runId === undefined;
    pair.runId = ex.state.runId;
    let answer;
    try { answer = await ex.api("runs"); } catch (error) { return; }
    pair.runs = answer.runs.filter((r) => !r.error);
    let wanted = pair.other;
    if (first) wanted = asked || (answer.pair && answer.pair[0] === pair.runId ? answer.pair[1] : "");
    fillPicker();
    await choose(wanted === pair.runId ? "" : wanted || "");
  }

  function fillPicker() {
    const picker = $("compare-picker");
    const others = pair.runs.filter((r) => r.id !== pair.runId);
    picker.hidden = !others.length;
    picker.innerHTML = "";
    const none = document.createElement("option");
    none.value = "";
    none.textContent = "compare with… (no second run)";
    picker.appendChild(none);
    for (const r of others) {
      const option = document.createElement("option");
      option.value = r.id;
      option.textContent = `compare with ${r.name} — ${r.model || "?"} (${r.steps} steps)`;
      picker.appendChild(option);
    }
    picker.onchange = () => choose(picker.value);
  }

  async function choose(other) {
    const ex = app();
    pair.other = other;
    pair.info = null;
    pair.series = {};
    pair.asked = {};
    $("compare-picker").value = other;
    ex.state.compare = other || null;
    ex.saveState();
    if (other) {
      try {
        pair.info = await ex.api("pair", { other });
      } catch (error) {
        pair.other = "";
        ex.state.compare = null;
        $("error").textContent = `Cannot compare with ${other}: ${error.message}`;
        $("error").hidden = false;
      }
    }
    renderBox();
    for (const cid of ex.state.panels) await decorate(cid);
  }

  // ----- the box of calls only one run has --------------------------------------------------------
  function renderBox() {
    const column = $("panels");
    let box = column.querySelector('[data-role="pair"]');
    if (!pair.info) { if (box) box.remove(); return; }
    if (!box) {
      box = document.createElement("section");
      box.className = "pair-box";
      box.dataset.role = "pair";
      column.prepend(box);
    }
    const { a, b, only_in_a: onlyA, only_in_b: onlyB } = pair.info;
    box.innerHTML = "<h3></h3>";
    box.firstChild.textContent = `${a.name} (this run) beside ${b.name}`;
    const call = (cid) => cid || "(the model)";
    for (const [run, list, key] of [[a, onlyA, "a"], [b, onlyB, "b"]]) {
      const p = document.createElement("p");
      p.dataset.only = key;
      p.textContent = list.length ? `only in ${run.name}: ` : `every call of ${run.name} is in both runs`;
      list.forEach((cid, i) => {
        const item = document.createElement(key === "a" ? "a" : "span");
        item.textContent = call(cid) + (i < list.length - 1 ? ", " : "");
        if (key === "a") item.onclick = () => app().pin(cid, true);  // only the open run's calls can be pinned
        p.appendChild(item);
      });
      box.appendChild(p);
    }
  }

  // ----- the other run's strips in a pinned panel ----------------------------------------------------
  async function otherSeries(cid) {
    const now = Date.now();
    if (pair.series[cid] && now - (pair.asked[cid] || 0) < REFETCH_MS) return pair.series[cid];
    pair.asked[cid] = now;
    if (pair.info.only_in_a.includes(cid)) { pair.series[cid] = {}; return {}; }
    const answer = await app().api("call_series", { call: cid, run: pair.other });
    pair.series[cid] = {};
    for (const s of answer.series) pair.series[cid][`${s.kind}/${s.name}`] = s;
    return pair.series[cid];
  }

  // both series over the union of their columns (matched by first and last step): a step is at
  // the same x on both strips; a column one run lacks is left blank
  function align(a, b) {
    const spans = new Map();
    for (const s of [a, b]) if (s) s.steps.forEach((st, i) => spans.set(`${st}:${s.last_steps[i]}`, [st, s.last_steps[i]]));
    const order = [...spans.values()].sort((x, y) => x[0] - y[0] || x[1] - y[1]);
    const fields = ["lo", "hi", "counts", "nonfinite", ...Strips().EXACT_FIELDS];
    const pad = (s) => {
      if (!s) return null;
      const at = new Map(s.steps.map((st, i) => [`${st}:${s.last_steps[i]}`, i]));
      const out = { ...s, steps: order.map((o) => o[0]), last_steps: order.map((o) => o[1]) };
      for (const f of fields) {
        if (!Array.isArray(s[f])) continue;
        const blank = f === "counts" ? [] : f === "nonfinite" ? 0 : null;
        out[f] = order.map(([st, last]) => { const i = at.get(`${st}:${last}`); return i === undefined ? blank : s[f][i]; });
      }
      return out;
    };
    return [pad(a), pad(b)];
  }

  // a red dashed line at the column of `step` (where the runs first differ; none: undefined)
  function markStep(canvas, s, step) {
    const i = step === undefined ? -1 : s.steps.indexOf(step);
    canvas.dataset.differs = i < 0 ? "" : String(step);
    if (i < 0) return;
    const M = Strips().MARGIN;
    const w = canvas.clientWidth || 400, h = canvas.clientHeight || 96;
    const x = M.left + (i + 0.5) * ((w - M.left - M.right) / s.steps.length);
    const ctx = canvas.getContext("2d");
    ctx.strokeStyle = "#d62728";
    ctx.lineWidth = 1.5;
    ctx.setLineDash([3, 2]);
    ctx.beginPath();
    ctx.moveTo(x, M.top);
    ctx.lineTo(x, h - M.bottom);
    ctx.stroke();
    ctx.setLineDash([]);
  }

  function runLabel(box, name, cls) {
    let tag = box.querySelector(".run-name");
    if (!tag) {
      tag = document.createElement("span");
      tag.className = `run-name ${cls}`;
      box.querySelector(".label").prepend(tag);
    }
    tag.textContent = name;
  }

  function otherBox(panel, after, key, s) {
    let box = panel.querySelector(`.strip.other[data-other="${CSS.escape(key)}"]`);
    if (!box) {
      box = document.createElement("div");
      box.className = "strip other";
      box.dataset.other = key;
      box.innerHTML = `<div class="label"><span class="kind"></span> <span class="name"></span> <span class="differs"></span></div><canvas></canvas><canvas class="line"></canvas>`;
      box.querySelector(".kind").textContent = (s ? s.kind : key.split("/")[0]).replace("_", " ");
      box.querySelector(".name").textContent = s ? s.name : key.slice(key.indexOf("/") + 1);
      const canvas = box.querySelector("canvas"), line = box.querySelector("canvas.line");
      canvas.dataset.otherSeries = key;
      line.dataset.otherLine = key;  // the other run's summary line, as under the open run's strip
      for (const c of [canvas, line]) {
        c.addEventListener("mousemove", (event) => hover(event, c, box.series, pair.info.b.name));
        c.addEventListener("mouseleave", () => { $("strip-tip").hidden = true; });
      }
    }
    if (after) after.after(box); else panel.appendChild(box);
    return box;
  }

  async function decorate(cid) {
    const panel = document.querySelector(`[data-panel="${CSS.escape(cid)}"]`);
    if (!panel) return;
    if (!pair.info) {
      panel.querySelectorAll(".strip.other, .run-name, .pair-note").forEach((el) => el.remove());
      return;
    }
    let theirs;
    try { theirs = await otherSeries(cid); } catch (error) { theirs = {}; }
    if (!pair.info || !panel.isConnected) return;
    const mine = app().state.series[cid] || {};
    const { a, b } = pair.info;
    const differs = pair.info.differs[cid] || {};
    const format = window.TorchlensUI.formatNumber;
    let note = panel.querySelector(".pair-note");
    if (pair.info.only_in_a.includes(cid)) {
      if (!note) { note = document.createElement("p"); note.className = "pair-note"; panel.querySelector("h3").after(note); }
      note.textContent = `This call is not in ${b.name}.`;
    } else if (note) note.remove();
    let previous = null;
    for (const canvas of panel.querySelectorAll("canvas[data-series]")) {
      const key = canvas.dataset.series, box = canvas.parentElement;
      const [sa, sb] = align(mine[key], theirs[key]);
      runLabel(box, a.name, "a");
      const other = otherBox(panel, box, key, theirs[key]);
      previous = other;
      runLabel(other, b.name, "b");
      const step = differs[key];
      other.querySelector(".differs").textContent = step === undefined ? "" : `· first differs at step ${step}`;
      const otherCanvas = other.querySelector("canvas");
      other.series = sb;
      if (sa && sa.steps.length && !canvas.hidden) {
        Strips().draw(canvas, sa, format);  // on the common step axis
        markStep(canvas, sa, step);
        const line = box.querySelector("canvas.line");
        if (line && !line.hidden) Strips().drawLine(line, sa, format);
        padded(canvas, sa.steps.length !== mine[key].steps.length ? sa : null, a.name);
      }
      otherCanvas.hidden = !sb || !sb.steps.length;
      if (!otherCanvas.hidden) {
        Strips().draw(otherCanvas, sb, format);
        markStep(otherCanvas, sb, step);
      }
      drawOtherLine(other, sb, format);
      other.querySelector(".name").title = theirs[key] ? "" : `not recorded in ${b.name}`;
      if (!theirs[key]) other.querySelector(".differs").textContent = `· not in ${b.name}`;
    }
    for (const key of Object.keys(theirs)) {  // series only the other run has
      if (panel.querySelector(`canvas[data-series="${CSS.escape(key)}"]`)) continue;
      const other = otherBox(panel, previous, key, theirs[key]);
      previous = other;
      runLabel(other, b.name, "b");
      other.querySelector(".differs").textContent = `· only in ${b.name}`;
      other.series = theirs[key];
      const otherCanvas = other.querySelector("canvas");
      otherCanvas.hidden = !theirs[key].steps.length;
      if (!otherCanvas.hidden) Strips().draw(otherCanvas, theirs[key], format);
      drawOtherLine(other, theirs[key], format);
    }
  }

  function drawOtherLine(box, s, format) {
    const line = box.querySelector("canvas.line");
    line.hidden = !s || !s.steps.length || !(s.line || []).some((v) => v !== null);
    if (!line.hidden) Strips().drawLine(line, s, format);
  }

  // this run's strip drawn with blank columns where only the other run has some: the page's
  // own hover counts its columns without them, so this one answers instead
  function padded(canvas, s, name) {
    canvas.pairSeries = s;
    if (canvas.pairHooked) return;
    canvas.pairHooked = true;
    const take = (event) => {
      if (!canvas.pairSeries) return;
      event.stopImmediatePropagation();  // a capturing listener on the canvas runs first
      hover(event, canvas, canvas.pairSeries, name);
    };
    canvas.addEventListener("mousemove", take, true);
  }

  function hover(event, canvas, s, name) {
    const tip = $("strip-tip"), M = Strips().MARGIN;
    const rect = canvas.getBoundingClientRect();
    const i = s ? Math.floor(((event.clientX - rect.left - M.left) / (rect.width - M.left - M.right)) * s.steps.length) : -1;
    if (i < 0 || i >= s.steps.length || s.lo[i] === null) { tip.hidden = true; return; }
    const format = window.TorchlensUI.formatNumber;
    const steps = s.steps[i] === s.last_steps[i] ? `step ${s.steps[i]}` : `steps ${s.steps[i]}–${s.last_steps[i]}`;
    const line = s.line && s.line[i] !== null && s.line[i] !== undefined ? ` · ${s.line_label || "line"} ${format(s.line[i])}` : "";
    tip.textContent = `${name} · ${steps} · histogram [${format(s.lo[i])}, ${format(s.hi[i])}]` + (s.nonfinite[i] ? ` · ${s.nonfinite[i]} NaN/inf` : "") + line;
    tip.hidden = false;
    window.TorchlensUI.placeFloating(tip, event);
  }

  document.addEventListener("torchlens:graph", () => { runChanged(); });
  document.addEventListener("torchlens:panel", (event) => { decorate(event.detail.cid); });
  // opening a run empties the panel column: the box comes back
  new MutationObserver(() => { if (pair.info && !$("panels").querySelector('[data-role="pair"]')) renderBox(); })
    .observe($("panels"), { childList: true });
})();
