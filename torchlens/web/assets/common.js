/* torchlens front-end helpers shared by the explorer page (explorer.js) and the op-level graph
 * page (graph.js): SVG elements and edge paths, zoom and pan of an <svg> with one root <g>,
 * fit-to-screen, floating tooltips with key/value tables, and number formatting.
 * Exposed as window.TorchlensUI; no library, no network. */
(function () {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";

  /** An SVG element with attributes, appended to parent when given. */
  function svgEl(tag, attrs, parent) {
    const el = document.createElementNS(SVG_NS, tag);
    for (const k in attrs || {}) el.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(el);
    return el;
  }

  /** Path data through points ([[x, y], ...]); spline: points are cubic Bézier segments. */
  function edgePath(points, spline) {
    if (!points.length) return "";
    let d = `M${points[0][0]},${points[0][1]}`;
    if (spline && points.length >= 4 && (points.length - 1) % 3 === 0) {
      for (let i = 1; i < points.length; i += 3) d += ` C${points[i]} ${points[i + 1]} ${points[i + 2]}`;
    } else {
      for (let i = 1; i < points.length; i++) d += ` L${points[i][0]},${points[i][1]}`;
    }
    return d;
  }

  /** An arrow-head marker with id `id` in the svg's <defs>. By default it is sized in units of
   *  the edge's stroke width (a thicker edge gets a bigger head); `fixed: true` makes it `size`
   *  drawing units (default 7) whatever the stroke, so a highlighted (thicker) edge keeps the
   *  same head as the others. */
  function arrowMarker(svg, id, color, opts) {
    const o = Object.assign({ fixed: false, size: 7 }, opts || {});
    const defs = svgEl("defs", {}, svg);
    const attrs = { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: o.size, markerHeight: o.size, orient: "auto-start-reverse" };
    if (o.fixed) attrs.markerUnits = "userSpaceOnUse";
    const marker = svgEl("marker", attrs, defs);
    svgEl("path", { d: "M0,0 L10,5 L0,10 z", fill: color }, marker);
    return defs;
  }

  /** Wheel zoom and background-drag pan of `svg`, moving the <g> that root() returns.
   *  `zoom` ({k, x, y}) is kept in place so callers can read and set it; skip(target) says
   *  which pointer-downs are not pans (nodes). Returns {apply, fit(w, h, opts), centerOn(x, y, k)}. */
  function zoomPan(svg, root, zoom, skip) {
    function apply() {
      const g = root();
      if (g) g.setAttribute("transform", `translate(${zoom.x},${zoom.y}) scale(${zoom.k})`);
    }
    svg.addEventListener("wheel", (event) => {
      event.preventDefault();
      const box = svg.getBoundingClientRect();
      const px = event.clientX - box.left, py = event.clientY - box.top;
      const k = Math.min(8, Math.max(0.01, zoom.k * Math.exp(-event.deltaY * 0.0015)));
      zoom.x = px - (px - zoom.x) * (k / zoom.k);
      zoom.y = py - (py - zoom.y) * (k / zoom.k);
      zoom.k = k;
      apply();
    }, { passive: false });
    let pan = null;
    svg.addEventListener("pointerdown", (event) => {
      if (skip && skip(event.target)) return;
      pan = { x: event.clientX, y: event.clientY, zx: zoom.x, zy: zoom.y };
      svg.classList.add("panning");
    });
    window.addEventListener("pointermove", (event) => {
      if (!pan) return;
      zoom.x = pan.zx + event.clientX - pan.x;
      zoom.y = pan.zy + event.clientY - pan.y;
      apply();
    });
    window.addEventListener("pointerup", () => { pan = null; svg.classList.remove("panning"); });

    /** Scale a width x height drawing to the svg (at most maxK), centred, topPad from the top. */
    function fit(width, height, opts) {
      const o = Object.assign({ maxK: 1.5, minK: 0.02, pad: 40, topPad: 20 }, opts || {});
      const box = svg.getBoundingClientRect();
      const k = Math.min(o.maxK, Math.max(o.minK, Math.min((box.width - o.pad) / Math.max(width, 1), (box.height - o.pad) / Math.max(height, 1))));
      zoom.k = k;
      zoom.x = (box.width - width * k) / 2;
      zoom.y = Math.max(o.topPad, (box.height - height * k) / 2);
      apply();
    }

    /** Put drawing point (x, y) in the middle of the svg, at scale k (default: current). */
    function centerOn(x, y, k) {
      const box = svg.getBoundingClientRect();
      if (k) zoom.k = k;
      zoom.x = box.width / 2 - x * zoom.k;
      zoom.y = box.height / 2 - y * zoom.k;
      apply();
    }
    return { apply, fit, centerOn };
  }

  /** Place a fixed-position element next to the mouse, inside the window. */
  function placeFloating(el, event) {
    const pad = 14;
    const w = el.offsetWidth, h = el.offsetHeight;
    let x = event.clientX + pad, y = event.clientY + pad;
    if (x + w > window.innerWidth) x = event.clientX - w - pad;
    if (y + h > window.innerHeight) y = event.clientY - h - pad;
    el.style.left = `${Math.max(0, x)}px`;
    el.style.top = `${Math.max(0, y)}px`;
  }

  /** Fill `box` with a title and a key/value table; a row ["§", text] is a section heading. */
  function fillTable(box, title, rows) {
    box.innerHTML = "";
    const h = document.createElement("h4");
    h.textContent = title;
    box.appendChild(h);
    const table = document.createElement("table");
    for (const [k, v] of rows) {
      const tr = table.insertRow();
      if (k === "§") { const td = tr.insertCell(); td.colSpan = 2; td.className = "sect"; td.textContent = v; continue; }
      const key = tr.insertCell(); key.className = "key"; key.textContent = k;
      tr.insertCell().textContent = v;
    }
    box.appendChild(table);
    return table;
  }

  /** A number in 3 significant digits, exponent form when very small or large; "–" for none. */
  function formatNumber(v) {
    if (v === null || v === undefined) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e4)) return v.toExponential(2);
    return Number(v.toPrecision(3)).toString();
  }

  /** Bytes as "253.5 KB". */
  function humanBytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0, v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return i ? `${v.toFixed(1)} ${units[i]}` : `${v} B`;
  }

  window.TorchlensUI = { SVG_NS, svgEl, edgePath, arrowMarker, zoomPan, placeFloating, fillTable, formatNumber, humanBytes };
})();
