/* torchlens explorer: one heat strip on a canvas, a histogram per column over training steps,
 * with its value range and step labels. Used by explorer.js (window.TorchlensStrips). */
(function () {
  "use strict";

  // margins around the plot area, in CSS pixels (the browser tests read strips with them)
  const MARGIN = { left: 52, right: 6, top: 6, bottom: 16 };

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

  window.TorchlensStrips = { MARGIN, draw, stepTicks };
})();
