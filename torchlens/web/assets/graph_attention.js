/* torchlens graph page: the heat map of decomposed attention (log_forward_pass(decompose=("sdpa",))),
 * one head at a time with a chooser, in the details panel of its probabilities op. Data made by
 * torchlens/trace/render/graph_page/attention.py: op.attention = {heads, shown, queries, keys, rows,
 * cols, batch, max: [per head], grids: [base64 bytes per head, row-major, 255 = that head's max]}.
 * Exposed as window.TorchlensGraphAttention; graph.js appends block(op.attention). */
(function () {
  "use strict";
  const SIDE = 256;  // px of the longer side of the drawn map

  function bytes(text) {
    const raw = atob(text), out = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  /** Paint head `head` into the canvas: white (0) to dark blue (that head's largest value). */
  function paint(canvas, map, head) {
    const cells = bytes(map.grids[head]);
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(map.cols, map.rows);
    for (let i = 0; i < cells.length; i++) {
      const v = cells[i] / 255;
      image.data.set([255 - 225 * v, 255 - 190 * v, 255 - 115 * v, 255], 4 * i);
    }
    ctx.putImageData(image, 0, 0);
    canvas.dataset.head = String(head);
  }

  /** The value under the pointer, as "query i, key j: p" (block ranges when averaged). */
  function cellText(map, head, row, col) {
    const span = (i, n, total) => {
      const a = Math.floor(i * total / n), b = Math.ceil((i + 1) * total / n) - 1;
      return a === b ? String(a) : `${a}–${b}`;
    };
    const value = bytes(map.grids[head])[row * map.cols + col] / 255 * map.max[head];
    const mean = map.rows < map.queries || map.cols < map.keys ? " (mean of the block)" : "";
    return `query ${span(row, map.rows, map.queries)}, key ${span(col, map.cols, map.keys)}: ${value.toPrecision(3)}${mean}`;
  }

  function block(map) {
    const box = document.createElement("div");
    box.dataset.role = "attention";
    const head = document.createElement("div");
    head.className = "sect";
    head.textContent = "attention pattern";
    const bar = document.createElement("div");
    const chooser = document.createElement("select");
    chooser.dataset.role = "attention-head";
    for (let h = 0; h < map.shown; h++) chooser.add(new Option(`head ${h}`, String(h)));
    const note = document.createElement("span");
    const parts = [`batch item 0 of ${map.batch}`, `${map.queries} queries × ${map.keys} keys`];
    if (map.shown < map.heads) parts.push(`first ${map.shown} of ${map.heads} heads`);
    if (map.rows < map.queries || map.cols < map.keys) parts.push(`averaged to ${map.rows} × ${map.cols}`);
    note.textContent = " " + parts.join(" · ");
    bar.append(chooser, note);
    const canvas = document.createElement("canvas");
    canvas.width = map.cols;
    canvas.height = map.rows;
    const scale = SIDE / Math.max(map.rows, map.cols);
    canvas.style.cssText = `width:${Math.round(map.cols * scale)}px;height:${Math.round(map.rows * scale)}px;` +
      "image-rendering:pixelated;border:1px solid #ccd;margin-top:4px;display:block";
    const readout = document.createElement("div");
    readout.dataset.role = "attention-cell";
    readout.textContent = "rows: queries, columns: keys; point at a cell for its value";
    chooser.onchange = () => paint(canvas, map, Number(chooser.value));
    canvas.onmousemove = (event) => {
      const r = canvas.getBoundingClientRect();
      const col = Math.min(map.cols - 1, Math.floor((event.clientX - r.left) / r.width * map.cols));
      const row = Math.min(map.rows - 1, Math.floor((event.clientY - r.top) / r.height * map.rows));
      readout.textContent = cellText(map, Number(chooser.value), row, col);
    };
    box.append(head, bar, canvas, readout);
    paint(canvas, map, 0);
    return box;
  }

  window.TorchlensGraphAttention = { block };
})();
