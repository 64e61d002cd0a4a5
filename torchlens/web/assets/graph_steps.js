/* The step slider of a generation's graph page (torchlens/trace/generate/page.py): DATA.steps
 * holds, per step of generate, [shape, dtype, nbytes, stats] for each node of the drawn
 * structure (null: not in that step). Moving the slider (data-role="step") copies that step's
 * values onto DATA.ops and redraws; the structure, open modules and selection stay. */
(function () {
  "use strict";
  const DATA = window.TORCHLENS_GRAPH;
  const graph = window.__torchlensGraph;
  if (!DATA || !DATA.steps || !graph || !graph.refresh) return;
  const header = document.querySelector("header");
  const box = document.createElement("span");
  box.className = "steps";
  box.style.cssText = "display:inline-flex;align-items:center;gap:6px;margin-left:8px";
  const slider = document.createElement("input");
  slider.type = "range";
  slider.min = "0";
  slider.max = String(DATA.steps.length - 1);
  slider.value = String(DATA.step);
  slider.dataset.role = "step";
  slider.title = "generation step (← → to move)";
  const label = document.createElement("span");
  label.dataset.role = "step-label";
  box.append("step", slider, label);
  header.appendChild(box);

  function show(k) {
    const step = DATA.steps[k];
    step.ops.forEach((values, i) => {
      const op = DATA.ops[i];
      if (values) [op.shape, op.dtype, op.nbytes, op.stats] = values;
      else Object.assign(op, { shape: null, dtype: null, nbytes: 0, stats: null });
    });
    const token = step.token === null || step.token === undefined ? "" : ` → token ${step.token}`;
    label.textContent = `${k} / ${DATA.steps.length - 1} · ${step.name}${token}`;
    document.body.dataset.step = String(k);
    graph.refresh(`step ${k}`);
  }

  slider.addEventListener("input", () => show(Number(slider.value)));
  show(DATA.step);
})();
