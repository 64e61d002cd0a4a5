/* torchlens explorer: one heat strip on a canvas, a histogram per column over training steps,
 * with its value range and step labels. Used by explorer.js (window.TorchlensStrips). */
(function () {
  "use strict";

  // margins around the plot area, in CSS pixels (the browser tests read strips with them)
  const MARGIN = { left: 52, right: 6, top: 6, bottom: 16 };
  // per-column statistics over all values (the histogram may be sampled and trimmed)
  const EXACT_FIELDS = ["count", "true_min", "true_max", "mean", "std", "nan", "posinf", "neginf", "zeros", "line"];

  function stripRange(s) {
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < s.lo.length; i++) {
      if (s.lo[i] !== null) lo = Math.min(lo, s.lo[i]);
      if (s.hi[i] !== null) hi = Math.max(hi, s.hi[i]);
    }
    if (!isFinite(lo)) return [0, 1];
    if (hi === lo) { const pad = Math.abs(lo) * 0.1 || 0.5; return [lo - pad, hi + pad]; }
    return [lo, hi];
  }

  function draw(canvas, s, format) {
    const ratio = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth || 400, cssH = canvas.clientHeight || 96;
    canvas.width = Math.round(cssW * ratio);
    canvas.height = Math.round(cssH * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);
    const plotW = cssW - MARGIN.left - MARGIN.right, plotH = cssH - MARGIN.top - MARGIN.bottom;
    ctx.fillStyle = "#fff";
    ctx.fillRect(MARGIN.left, MARGIN.top, plotW, plotH);
    const n = s.steps.length;
    const [ymin, ymax] = stripRange(s);
    const yOf = (v) => MARGIN.top + plotH * (1 - (v - ymin) / (ymax - ymin));
    const colW = n ? plotW / n : plotW;
    const [r, g, b] = [31, 95, 168];
    for (let i = 0; i < n; i++) {
      const counts = s.counts[i];
      const lo = s.lo[i], hi = s.hi[i];
      if (lo === null) continue;
      let peak = 0;
      for (const c of counts) peak = Math.max(peak, c);
      if (!peak) continue;
      const bins = counts.length;
      const width = (hi - lo) / bins;
      const x = MARGIN.left + i * colW;
      for (let k = 0; k < bins; k++) {
        const c = counts[k];
        if (c <= 0) continue;  // white: an empty bin
        const alpha = 0.12 + 0.88 * Math.sqrt(c / peak);
        ctx.fillStyle = `rgba(${r},${g},${b},${alpha.toFixed(3)})`;
        let top, bottom;
        if (width > 0) { top = yOf(lo + (k + 1) * width); bottom = yOf(lo + k * width); } else { top = yOf(lo) - 1.5; bottom = yOf(lo) + 1.5; }
        ctx.fillRect(x, top, Math.max(colW, 1), Math.max(bottom - top, 1));
      }
      if (s.nonfinite[i] > 0) { ctx.fillStyle = "#d62728"; ctx.fillRect(x, MARGIN.top, Math.max(colW, 1), 3); }
    }
    const [marked, far, carets] = drawBeyond(ctx, s, { colW, yOf, plotH });
    canvas.dataset.beyond = String(marked);
    canvas.dataset.far = String(far);
    canvas.dataset.carets = String(carets);
    if (ymin < 0 && ymax > 0) {
      ctx.strokeStyle = "#555";
      ctx.setLineDash([4, 3]);
      ctx.beginPath();
      ctx.moveTo(MARGIN.left, yOf(0) + 0.5);
      ctx.lineTo(MARGIN.left + plotW, yOf(0) + 0.5);
      ctx.stroke();
      ctx.setLineDash([]);
    }
    ctx.strokeStyle = "#ccc";
    ctx.strokeRect(MARGIN.left + 0.5, MARGIN.top + 0.5, plotW - 1, plotH - 1);
    ctx.fillStyle = "#444";
    ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "top";
    ctx.fillText(format(ymax), MARGIN.left - 4, MARGIN.top);
    ctx.textBaseline = "bottom";
    ctx.fillText(format(ymin), MARGIN.left - 4, MARGIN.top + plotH);
    const ticks = n ? stepTicks(s, plotW, colW, (text) => ctx.measureText(text).width) : [];
    ctx.textBaseline = "top";
    ctx.textAlign = "center";
    for (const t of ticks) ctx.fillText(String(t.step), t.x, MARGIN.top + plotH + 2);
    canvas.dataset.ticks = ticks.map((t) => `${t.step}@${t.x.toFixed(1)}`).join(" ");
    canvas.dataset.columns = String(n);
  }

  // where the true range (over all values) goes beyond the histogram's (sampled, trimmed) bins:
  // a light orange band from the bins' edge to the true extreme, a dark tick at the extreme, and
  // where the extreme lies beyond the axis and is a spike, more than SPIKE_STD standard deviations
  // from the mean of all values (without them: more than half the axis beyond it), a caret at the
  // plot's edge, darker the farther out (a spike of 100x the axis is black-orange). Trimming's
  // usual overshoot (the tails of the 10% outliers left out, ~4 std for 10^4 normal values)
  // stays a band: a caret on every column would say nothing.
  // Returns [columns marked, columns with an extreme beyond the axis by more than its span,
  // columns with a caret].
  const SPIKE_STD = 6;
  function drawBeyond(ctx, s, geo) {
    if (!s.true_min || s.true_min.length !== s.steps.length) return [0, 0, 0];
    const top = MARGIN.top, bottom = MARGIN.top + geo.plotH;
    let marked = 0, far = 0, carets = 0;
    for (let i = 0; i < s.steps.length; i++) {
      const x = MARGIN.left + i * geo.colW, w = Math.max(geo.colW, 1);
      let any = false, out = false, caret = false;
      for (const [edge, extreme, sign] of [[s.hi[i], s.true_max[i], 1], [s.lo[i], s.true_min[i], -1]]) {
        if (extreme === null || extreme === undefined || edge === null || !(sign * (extreme - edge) > 0)) continue;
        any = true;
        const yEdge = geo.yOf(edge), yExtreme = geo.yOf(extreme);
        const y0 = Math.min(Math.max(yEdge, top), bottom), y1 = Math.min(Math.max(yExtreme, top), bottom);
        ctx.fillStyle = "rgba(255,127,14,0.18)";
        ctx.fillRect(x, Math.min(y0, y1), w, Math.max(Math.abs(y1 - y0), 1));
        const beyond = sign > 0 ? top - yExtreme : yExtreme - bottom;  // pixels past the axis
        if (beyond <= 0) { ctx.fillStyle = "#b35806"; ctx.fillRect(x, y1 - 1, w, 2); continue; }
        const excess = beyond / (bottom - top);  // in axis spans
        if (excess > 1) out = true;
        const spread = s.std ? s.std[i] : null, centre = s.mean ? s.mean[i] : null;
        const spike = spread !== null && spread !== undefined && centre !== null && centre !== undefined
          ? Math.abs(extreme - centre) > SPIKE_STD * spread : excess > 0.5;
        if (!spike) continue;  // the band reaches the edge: a usual tail
        caret = true;
        const alpha = Math.min(1, 0.2 + 0.4 * Math.log10(1 + 10 * excess));
        ctx.fillStyle = `rgba(179,88,6,${alpha.toFixed(3)})`;
        const up = sign > 0, mid = x + w / 2, half = Math.max(w / 2, 2), h = excess > 1 ? 8 : 4;
        ctx.beginPath();
        ctx.moveTo(mid - half, up ? top + h : bottom - h);
        ctx.lineTo(mid + half, up ? top + h : bottom - h);
        ctx.lineTo(mid, up ? top : bottom);
        ctx.fill();
      }
      if (any) marked++;
      if (out) far++;
      if (caret) carets++;
    }
    return [marked, far, carets];
  }

  // the line under a strip: one scalar per column (s.line: std, median per-sample norm, norm or
  // update ratio), on a log axis when it spans decades of positive values, aligned with the strip
  function drawLine(canvas, s, format) {
    const ratio = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth || 400, cssH = canvas.clientHeight || 34;
    canvas.width = Math.round(cssW * ratio);
    canvas.height = Math.round(cssH * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);
    const values = (s.line || []).slice(0, s.steps.length);
    const shown = values.filter((v) => v !== null && v !== undefined);
    canvas.dataset.points = String(shown.length);
    if (!shown.length) return null;
    const plotW = cssW - MARGIN.left - MARGIN.right, top = 3, plotH = cssH - 6;
    let lo = Math.min(...shown), hi = Math.max(...shown);
    const log = lo > 0 && hi / lo > 100;
    const f = log ? Math.log10 : (v) => v;
    if (hi === lo) { lo -= Math.abs(lo) * 0.1 || 0.5; hi += Math.abs(hi) * 0.1 || 0.5; }
    const yOf = (v) => top + plotH * (1 - (f(v) - f(lo)) / (f(hi) - f(lo)));
    const colW = s.steps.length ? plotW / s.steps.length : plotW;
    ctx.strokeStyle = "#eee";
    ctx.strokeRect(MARGIN.left + 0.5, 0.5, plotW - 1, cssH - 1);
    ctx.strokeStyle = "#1f5fa8";
    ctx.fillStyle = "#1f5fa8";
    ctx.lineWidth = 1.25;
    ctx.beginPath();
    let pen = false;
    values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = false; return; }
      const x = MARGIN.left + (i + 0.5) * colW, y = yOf(v);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
      if (values.length < 40) ctx.fillRect(x - 1.5, y - 1.5, 3, 3);
    });
    ctx.stroke();
    ctx.fillStyle = "#667";
    ctx.font = "9px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "top";
    ctx.fillText(format(hi), MARGIN.left - 4, 0);
    ctx.textBaseline = "bottom";
    ctx.fillText(format(lo), MARGIN.left - 4, cssH);
    return { colW };
  }

  // x of a training step: columns are evenly spread, each at the middle of the steps it covers;
  // between (and beyond) column middles, linear in the step
  function stepX(s, colW, step) {
    const n = s.steps.length;
    const mid = (i) => (s.steps[i] + s.last_steps[i]) / 2;
    const xOf = (i) => MARGIN.left + (i + 0.5) * colW;
    if (n === 1) return xOf(0);
    let i = 0;
    while (i < n - 2 && mid(i + 1) < step) i++;
    const span = mid(i + 1) - mid(i);
    return span > 0 ? xOf(i) + ((step - mid(i)) / span) * colW : xOf(i);
  }

  // step labels: the first step, then the multiples of a "nice" interval (1, 2 or 5 x 10^k)
  // wide enough for the labels not to touch; all at their steps' places, so evenly spaced
  function stepTicks(s, plotW, colW, textWidth) {
    const n = s.steps.length;
    const first = s.steps[0], last = s.last_steps[n - 1];
    const left = MARGIN.left, right = MARGIN.left + plotW;
    const place = (step) => {
      const half = textWidth(String(step)) / 2;
      return { step, x: Math.min(Math.max(stepX(s, colW, step), left + half), right - half), half };
    };
    const ticks = [place(first)];
    if (last === first) return ticks;
    const labelW = textWidth(String(last)) + 12;
    const pxPerStep = Math.abs(stepX(s, colW, last) - stepX(s, colW, first)) / (last - first) || 1;
    let every = 1;
    for (let k = 1; every * pxPerStep < labelW; k++) every = [1, 2, 5][k % 3] * 10 ** Math.floor(k / 3);
    for (let step = (Math.floor(first / every) + 1) * every; step <= last; step += every) {
      const tick = place(step);
      const previous = ticks[ticks.length - 1];
      if (tick.x - tick.half < previous.x + previous.half + 4) {
        if (ticks.length === 1) continue;  // too close to the first step: the first stays
        break;
      }
      ticks.push(tick);
    }
    return ticks;
  }

  // new columns of a panel's series ({kind/name: series}) into what the page has: columns that
  // began before the update are kept; a column that was still filling is replaced by its newer self
  function merge(known, freshList) {
    for (const fresh of freshList) {
      const key = `${fresh.kind}/${fresh.name}`;
      const old = known[key];
      if (!old) { known[key] = fresh; continue; }
      const keep = old.steps.filter((st) => !fresh.steps.includes(st)).length;
      for (const field of ["steps", "last_steps", "lo", "hi", "counts", "nonfinite", ...EXACT_FIELDS]) {
        old[field] = old[field].slice(0, keep).concat(fresh[field]);
      }
      old.reason = fresh.reason;
    }
    return known;
  }

  window.TorchlensStrips = { MARGIN, EXACT_FIELDS, draw, drawLine, stepTicks, merge };
})();
