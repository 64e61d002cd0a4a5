/* torchlens explorer in a notebook, live: the page's data (window.TORCHLENS_EXPORT, one run)
 * is kept up to date by the notebook widget around the page's iframe, which relays what the
 * kernel pushes (torchlens/train/backends/notebook.py) with postMessage. explorer.js polls this data as
 * it polls a server, so the live view draws with the same code as the served page.
 * Every update is applied idempotently: the widget replays all it has seen to a page that
 * unpacks late (a notebook unpacks a page only once it is on screen). */
(function () {
  "use strict";

  const data = window.TORCHLENS_EXPORT;
  if (!data || !data.live) return;

  function apply(update) {
    const summary = data.summary;
    if (update.summary) {  // new calls: the whole summary, the layouts that changed with them
      const steps = summary.steps;
      Object.assign(summary, update.summary);
      if (steps.length > summary.steps.length) summary.steps = steps;
      Object.assign(data.layouts, update.layouts || {});
    }
    const last = summary.steps.length ? summary.steps[summary.steps.length - 1] : -1;
    for (const step of update.steps || []) if (step > last) summary.steps.push(step);
    if (update.status) summary.status = update.status;
    if (update.restart) data.call_series = {};  // the stride changed: columns were merged
    if (update.stride) summary.stride = update.stride;
    for (const [cid, answer] of Object.entries(update.series || {})) {
      const known = data.call_series[cid] || { call: cid, series: [] };
      const byKey = {};
      for (const s of known.series) byKey[`${s.kind}/${s.name}`] = s;
      known.series = Object.values(window.TorchlensStrips.merge(byKey, answer.series));
      known.stride = answer.stride;
      data.call_series[cid] = known;
    }
    document.body.dataset.liveStep = String(lastStep());
  }

  function lastStep() {
    const steps = data.summary.steps;
    return steps.length ? steps[steps.length - 1] : -1;
  }

  window.addEventListener("message", (event) => {
    const message = event.data;
    if (event.source !== window.parent || !message) return;
    if (message.torchlens === "update") apply(message.update);
    // the kernel's feed stopped: the status line says so (the page polls it), what is drawn stays
    if (message.torchlens === "error") data.summary.status = message.message;
  });
  window.parent.postMessage({ torchlens: "ready", last: lastStep() }, "*");
})();
