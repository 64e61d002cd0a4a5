/* torchlens graph page: the overlay, a value per operation that colours its node (made by
 * torchlens/trace/render/graph_page/overlay.py: data.overlay = {name, scale, caption, legend:
 * [{color, text}], nodes: {label: {fill, ink, text, severity}}}). Exposed as
 * window.TorchlensGraphOverlay; graph.js draws with it. */
(function () {
  "use strict";

  /** The paint of the node with this label (null: no overlay, or no value for it). */
  function paintOf(data, label) { return data.overlay ? data.overlay.nodes[label] || null : null; }

  /** The paint of the worst value among the nodes of these containers (null: none has one):
   *  a closed module shows it, so a collapsed graph still says where to look. */
  function worstInside(data, model, cids) {
    if (!data.overlay) return null;
    let worst = null;
    for (const c of cids) {
      for (const n of model.nodesIn[model.mode][c] || []) {
        const p = paintOf(data, model.view.nodes[n].label);
        if (p && (!worst || p.severity > worst.severity)) worst = p;
      }
    }
    return worst;
  }

  /** Fill the legend box: the overlay's name, its caption, a swatch per colour. */
  function drawLegend(box, overlay) {
    if (!overlay) return;
    box.hidden = false;
    box.textContent = "";
    const title = document.createElement("div");
    title.className = "legend-title";
    title.textContent = overlay.name;
    box.appendChild(title);
    if (overlay.caption) box.appendChild(Object.assign(document.createElement("div"), { className: "legend-caption", textContent: overlay.caption }));
    for (const entry of overlay.legend) {
      const row = document.createElement("div");
      row.className = "legend-row";
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = entry.color;
      row.append(swatch, entry.text);
      box.appendChild(row);
    }
  }

  window.TorchlensGraphOverlay = { paintOf, worstInside, drawLegend };
})();
