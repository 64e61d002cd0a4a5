/* torchlens explorer: the Health panel (run.health()'s findings, worst first), a status line in
 * the header, and badges on graph nodes whose subtree has a finding still true at the latest
 * step. Findings that ended earlier (an update ratio high in AdamW's first steps) are folded
 * under "ended earlier": no badges, and the pinned strips below stay in view. Data: GET /api/health.
 * Clicking a finding opens the call's parent graph, pins the call's strips and marks the step.
 * Loaded before explorer.js; works through window.TorchlensExplorer and its "torchlens:graph"
 * event. An exported page (no server) carries the findings in its data (without the links to
 * the operation pages, which stay in the run folder). */
(function () {
  "use strict";

  const REFRESH_MS = 10000;
  const COLORS = { nonfinite: "#c62828", exploding: "#e65100", vanishing: "#6a1b9a", dead: "#455a64", saturated: "#00838f", update_ratio: "#9e7700" };
  const LABELS = { nonfinite: "NaN/Inf", exploding: "exploding", vanishing: "vanishing", dead: "dead", saturated: "saturated", update_ratio: "update size" };
  const health = { runId: undefined, findings: [], status: "", timer: null };

  const app = () => window.TorchlensExplorer;
  const $ = (role) => document.querySelector(`[data-role="${role}"]`);

  async function load() {
    const ex = app();
    if (!ex || !ex.state.summary) return;
    let answer;
    try {
      const exported = window.TORCHLENS_EXPORT;  // a file with the data inline: its findings came with it
      const data = exported && (exported.runs ? exported.run_data[ex.state.runId] : exported);
      answer = exported ? data.health : await ex.api("health");
      if (!answer) throw new Error("no health data");
    } catch (error) {  // an exported page, or a server without the route: no panel
      health.findings = [];
      health.status = "";
      render();
      return;
    }
    health.findings = answer.findings;
    health.status = answer.status;
    render();
  }

  function statusBox() {
    let box = $("health-status");
    if (!box) {
      box = document.createElement("span");
      box.className = "health-status";
      box.dataset.role = "health-status";
      box.onclick = () => { const now = current(); if (now.length) go(now[0]); };
      const status = $("status");
      status.parentNode.insertBefore(box, status);
    }
    return box;
  }

  function panelBox() {
    const column = $("panels");
    let box = column.querySelector('[data-role="health"]');
    if (!box) {
      box = document.createElement("section");
      box.className = "health-panel";
      box.dataset.role = "health";
      column.prepend(box);
    }
    return box;
  }

  const current = () => health.findings.filter((f) => f.active);

  function render() {
    const now = current();
    const ended = health.findings.filter((f) => !f.active);
    const status = statusBox();
    status.textContent = health.status;
    status.hidden = !health.status;
    status.classList.toggle("bad", now.some((f) => f.signal === "nonfinite"));
    status.classList.toggle("ok", Boolean(health.status) && !now.length);
    const box = panelBox();
    box.hidden = !health.status;
    box.classList.toggle("clear", !now.length);  // no red edge without a finding true now
    box.innerHTML = "";
    const h = document.createElement("h3");
    h.textContent = now.length ? `Health · ${now.length} finding${now.length > 1 ? "s" : ""}` : "Health · no finding now";
    box.appendChild(h);
    const list = document.createElement("ol");
    box.appendChild(list);
    let endedList = list;
    if (ended.length) {  // folded: history, not an alarm
      const fold = document.createElement("details");
      fold.dataset.role = "health-ended";
      const summary = document.createElement("summary");
      summary.textContent = `${ended.length} ended earlier`;
      endedList = document.createElement("ol");
      fold.append(summary, endedList);
      box.appendChild(fold);
    }
    health.findings.forEach((f, i) => {
      const item = document.createElement("li");
      item.dataset.finding = String(i);
      item.dataset.call = f.call;
      item.title = "open this call, pin its strips and mark the step";
      const chip = document.createElement("span");
      chip.className = "chip";
      chip.style.background = COLORS[f.signal] || "#666";
      chip.textContent = LABELS[f.signal] || f.signal;
      const where = document.createElement("b");
      where.textContent = f.address || (app() ? app().state.summary.model : "model");
      const when = document.createElement("span");
      when.className = "when";
      when.textContent = ` ${f.series} · since step ${f.first_step}${f.active ? "" : " (not now)"}`;
      const why = document.createElement("div");
      why.className = "why";
      why.textContent = f.explanation;
      item.append(chip, " ", where, when, why);
      if (f.page && !window.TORCHLENS_EXPORT) {  // the page is a file of the run folder, not in an export
        const a = document.createElement("a");
        a.href = `/run-file?${new URLSearchParams({ run: app().state.runId || ".", name: f.page })}`;
        a.target = "_blank";
        a.rel = "noopener";
        a.className = "op-page";
        a.textContent = "open the operation graph ↗";
        a.onclick = (event) => event.stopPropagation();
        why.append(" ", a);
      }
      item.onclick = () => go(f);
      (f.active ? list : endedList).appendChild(item);
    });
    badges();
  }

  // ----- a finding clicked: its call's graph, its strips pinned, the step marked ---------------
  async function go(f) {
    const ex = app();
    const calls = ex.state.summary.calls;
    if (!(f.call in calls)) return;
    const parent = calls[f.call].parent;
    const view = parent === null || parent === undefined ? "" : parent;
    if (ex.state.view !== view) await ex.showCall(view);
    const node = document.querySelector(`[data-node="${CSS.escape(f.call)}"]`);
    if (node) { node.classList.add("found"); setTimeout(() => node.classList.remove("found"), 2500); }
    await ex.pin(f.call, true);
    const panel = document.querySelector(`[data-panel="${CSS.escape(f.call)}"]`);
    if (panel) { ex.reveal(panel); markStep(panel, f); }
  }

  function markStep(panel, f) {
    const ex = app();
    const series = ex.state.series[f.call] || {};
    const margin = window.TorchlensStrips.MARGIN;
    panel.querySelectorAll(".health-mark").forEach((m) => m.remove());
    panel.querySelectorAll("canvas[data-series]").forEach((canvas) => {
      const s = series[canvas.dataset.series];
      if (!s || !s.steps.length || canvas.hidden) return;
      let i = s.steps.findIndex((st, k) => st <= f.first_step && f.first_step <= s.last_steps[k]);
      if (i < 0) i = s.steps.findIndex((st) => st >= f.first_step);
      if (i < 0) return;
      canvas.parentElement.style.position = "relative";  // before reading offsets: the mark sits in the strip's box
      const plotW = canvas.clientWidth - margin.left - margin.right;
      const mark = document.createElement("div");
      mark.className = "health-mark";
      mark.dataset.step = String(s.steps[i]);
      mark.title = `step ${f.first_step}: ${LABELS[f.signal] || f.signal}`;
      mark.style.left = `${canvas.offsetLeft + margin.left + plotW * (i + 0.5) / s.steps.length}px`;
      mark.style.top = `${canvas.offsetTop}px`;
      mark.style.height = `${canvas.offsetHeight}px`;
      mark.style.borderColor = COLORS[f.signal] || "#c00";
      canvas.parentElement.appendChild(mark);
    });
  }

  // ----- badges: a node whose subtree (the call or a call inside it) has a finding true now ------
  function badges() {
    const ex = app();
    if (!ex || !ex.state.summary) return;
    const calls = ex.state.summary.calls;
    const under = {};  // call id -> findings in its subtree
    for (const f of current()) {
      for (let c = f.call; c !== null && c !== undefined && c in calls; c = calls[c].parent) {
        (under[c] = under[c] || []).push(f);
        if (c === "") break;
      }
    }
    document.querySelectorAll(".node.call").forEach((g) => {
      const old = g.querySelector(".health-badge");
      if (old) old.remove();
      const found = under[g.dataset.node];
      if (!found) return;
      const rect = g.querySelector("rect");
      const w = Number(rect.getAttribute("width"));
      const worst = found[0];  // findings come worst first
      const ns = "http://www.w3.org/2000/svg";
      const badge = document.createElementNS(ns, "g");
      badge.setAttribute("class", "health-badge");
      badge.setAttribute("data-signal", worst.signal);
      badge.setAttribute("transform", `translate(${w - 2},2)`);
      const circle = document.createElementNS(ns, "circle");
      circle.setAttribute("r", "9");
      circle.setAttribute("fill", COLORS[worst.signal] || "#c00");
      const text = document.createElementNS(ns, "text");
      text.textContent = String(found.length);
      const title = document.createElementNS(ns, "title");
      title.textContent = found.map((f) => `${LABELS[f.signal] || f.signal}: ${f.address || "model"} since step ${f.first_step}`).join("\n");
      badge.append(circle, text, title);
      g.appendChild(badge);
    });
  }

  document.addEventListener("torchlens:graph", () => {
    const ex = app();
    if (!ex) return;
    if (health.runId !== ex.state.runId) {
      health.runId = ex.state.runId;
      load();
      if (!health.timer) health.timer = setInterval(() => { if (app().state.summary && app().state.summary.status === "running") load(); }, REFRESH_MS);
    } else {
      if (!$("panels").querySelector('[data-role="health"]')) render(); else badges();
    }
  });

  // the explorer empties the panel column when it opens a run: put the panel back on top
  new MutationObserver(() => {
    const column = $("panels");
    if (health.status && !column.querySelector('[data-role="health"]')) render();
  }).observe($("panels"), { childList: true });

  window.TorchlensHealth = { load, go, findings: () => health.findings };
})();
