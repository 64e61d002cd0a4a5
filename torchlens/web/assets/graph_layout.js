/* torchlens graph page: a layered (Sugiyama-style) layout of one level of the nested graph,
 * top to bottom. Exposed as window.TorchlensLayout.layoutLevel(items, edges, ports, options).
 *
 *   items: [{w, h}]            sizes of the level's children (operations, collapsed modules,
 *                              folded runs, and expanded module boxes already laid out inside)
 *   edges: [[tail, head]]      indices into items (duplicates and self loops are ignored)
 *   ports: {entries: [[head, ...]], exits: [[tail, ...]]}  (optional) edges crossing the
 *                              border of the box being laid out: each entry is one tail outside
 *                              feeding these items, each exit one head outside fed by them
 *   returns {width, height, x: [], y: [] (centres), routes: Map("t>h" -> [[x, y], ...] points),
 *            entryRoutes: [Map(head -> points)], exitRoutes: [Map(tail -> points)]}
 *
 * Steps, each linear in items + edges (+ bends): cycles broken by a depth-first search (the
 * rolled view of a loop has cycles); ranks by longest path, sources pulled down next to their
 * first consumer; long edges split by bend points, one per rank they cross; a few barycentre
 * sweeps order each rank; x by isotonic regression (pool-adjacent-violators) towards the mean
 * of neighbours, which keeps the order and the gaps and is exact for each sweep; last, from
 * the top, each link of a chain of items (and each bend of a long edge) is set straight below
 * the one above where its row leaves room, which the means leave a little askew.
 *
 * A port is a virtual node on the top rank (an entry) or the bottom rank (an exit), linked to
 * its items below the top (above the bottom) by bend points like any long edge: so an edge
 * from outside to an item deep in the box runs beside the box's own chain, not through it.
 * Items on the top (bottom) rank itself need no port and get no route. Each bend or port is
 * routed as a vertical line down its rank (two points, one where the rank is empty). */
(function () {
  "use strict";

  const DEFAULTS = { nodeGap: 18, rankGap: 34, bendWidth: 8, sweeps: 4, placeIterations: 4 };

  function breakCycles(n, out) {
    // iterative DFS; an edge to a node on the stack is reversed
    const state = new Uint8Array(n), reversed = new Set();
    for (let s = 0; s < n; s++) {
      if (state[s]) continue;
      const stack = [[s, 0]];
      state[s] = 1;
      while (stack.length) {
        const top = stack[stack.length - 1];
        const [v, i] = top;
        if (i < out[v].length) {
          top[1]++;
          const w = out[v][i];
          if (state[w] === 1) reversed.add(v + ">" + w);
          else if (!state[w]) { state[w] = 1; stack.push([w, 0]); }
        } else { state[v] = 2; stack.pop(); }
      }
    }
    return reversed;
  }

  function rankNodes(n, succ, pred) {
    const indeg = pred.map((p) => p.length), order = [], rank = new Array(n).fill(0);
    const queue = [];
    for (let v = 0; v < n; v++) if (!indeg[v]) queue.push(v);
    for (let q = 0; q < queue.length; q++) {
      const v = queue[q];
      order.push(v);
      for (const w of succ[v]) {
        rank[w] = Math.max(rank[w], rank[v] + 1);
        if (--indeg[w] === 0) queue.push(w);
      }
    }
    // a source feeding later nodes only (a buffer, a constant) sits just above its first consumer
    for (let q = order.length - 1; q >= 0; q--) {
      const v = order[q];
      if (pred[v].length || !succ[v].length) continue;
      let r = Infinity;
      for (const w of succ[v]) r = Math.min(r, rank[w]);
      if (r - 1 > rank[v]) rank[v] = r - 1;
    }
    return rank;
  }

  /** Positions minimising sum (x_i - want_i)^2 with x_{i+1} - x_i >= gap_i (PAVA). */
  function placeRow(want, gaps) {
    const n = want.length, offset = new Float64Array(n);
    for (let i = 1; i < n; i++) offset[i] = offset[i - 1] + gaps[i - 1];
    const blockSum = [], blockCount = [], blockStart = [];
    for (let i = 0; i < n; i++) {
      blockSum.push(want[i] - offset[i]); blockCount.push(1); blockStart.push(i);
      while (blockSum.length > 1) {
        const b = blockSum.length - 1;
        if (blockSum[b - 1] / blockCount[b - 1] <= blockSum[b] / blockCount[b]) break;
        blockSum[b - 1] += blockSum[b]; blockCount[b - 1] += blockCount[b];
        blockSum.pop(); blockCount.pop(); blockStart.pop();
      }
    }
    const x = new Array(n);
    for (let b = 0; b < blockSum.length; b++) {
      const value = blockSum[b] / blockCount[b], end = b + 1 < blockStart.length ? blockStart[b + 1] : n;
      for (let i = blockStart[b]; i < end; i++) x[i] = value + offset[i];
    }
    return x;
  }

  /** The node `v` should stand under: its one item above when that has no other item below
   *  (a link of a chain), or, for a bend, the one bend (or port) above it; -1 for none. Items
   *  are 0..n-1, bends and ports after. */
  function alignedAbove(v, n, up, down) {
    const above = up[v];
    if (v >= n) return above.length === 1 && above[0] >= n ? above[0] : -1;
    let u = -1;
    for (const w of above) if (w < n) { if (u >= 0) return -1; u = w; }
    if (u < 0) return -1;
    for (const w of down[u]) if (w < n && w !== v) return -1;
    return u;
  }

  /** Rank by rank from the top, move each node under the node it aligns with, as far as its
   *  neighbours in the row leave room (order and gaps kept). */
  function straighten(rows, rowGaps, x, n, up, down) {
    for (let r = 1; r < rows.length; r++) {
      const row = rows[r], gaps = rowGaps[r];
      for (let i = 0; i < row.length; i++) {
        const u = alignedAbove(row[i], n, up, down);
        if (u < 0) continue;
        const lo = i ? x[row[i - 1]] + gaps[i - 1] : -Infinity;
        const hi = i + 1 < row.length ? x[row[i + 1]] - gaps[i] : Infinity;
        x[row[i]] = Math.min(hi, Math.max(lo, x[u]));
      }
    }
  }

  function layoutLevel(items, edges, ports, options) {
    const o = Object.assign({}, DEFAULTS, options || {});
    const n = items.length;
    const entries = (ports && ports.entries) || [], exits = (ports && ports.exits) || [];
    if (!n) return { width: 0, height: 0, x: [], y: [], routes: new Map(), entryRoutes: entries.map(() => new Map()), exitRoutes: exits.map(() => new Map()) };
    const seen = new Set(), rawOut = Array.from({ length: n }, () => []), pairs = [];
    for (const [t, h] of edges) {
      const key = t + ">" + h;
      if (t === h || seen.has(key)) continue;
      seen.add(key); rawOut[t].push(h); pairs.push([t, h]);
    }
    const reversed = breakCycles(n, rawOut);
    const succ = Array.from({ length: n }, () => []), pred = Array.from({ length: n }, () => []);
    const dag = pairs.map(([t, h]) => (reversed.has(t + ">" + h) ? [h, t, true] : [t, h, false]));
    const dagSeen = new Set();
    for (const [t, h] of dag) {
      if (dagSeen.has(t + ">" + h)) continue;
      dagSeen.add(t + ">" + h); succ[t].push(h); pred[h].push(t);
    }
    const rank = rankNodes(n, succ, pred);

    // virtual graph: real nodes then bends; links between consecutive ranks only
    const width = items.map((it) => it.w), vRank = rank.slice();
    const up = Array.from({ length: n }, () => []), down = Array.from({ length: n }, () => []);
    const chains = [];  // [tail, head, bend ids (top to bottom), reversed]
    const addVirtual = (r) => {
      width.push(o.bendWidth); vRank.push(r); up.push([]); down.push([]);
      return width.length - 1;
    };
    // top -> bends on the ranks strictly between r0 and r1 -> bottom; returns the bends
    const linkChain = (top, bottom, r0, r1) => {
      let prev = top;
      const bends = [];
      for (let r = r0 + 1; r < r1; r++) {
        const b = addVirtual(r);
        down[prev].push(b); up[b].push(prev); bends.push(b); prev = b;
      }
      down[prev].push(bottom); up[bottom].push(prev);
      return bends;
    };
    for (const [t, h, rev] of dag) chains.push([t, h, linkChain(t, h, rank[t], rank[h]), rev]);
    const lastRank = Math.max(...rank);
    // ports: [port node or -1, [[item, bends]]]; items on the port's own rank are left out
    const portChains = (linked, r, link) => {
      if (!linked.length) return [-1, []];
      const p = addVirtual(r);
      return [p, linked.map((v) => [v, link(p, v)])];
    };
    const entryChains = entries.map((heads) => portChains(heads.filter((h) => rank[h] > 0), 0,
      (p, h) => linkChain(p, h, 0, rank[h])));
    const exitChains = exits.map((tails) => portChains(tails.filter((t) => rank[t] < lastRank), lastRank,
      (p, t) => linkChain(t, p, rank[t], lastRank)));
    const numRanks = Math.max(...vRank) + 1;
    const rows = Array.from({ length: numRanks }, () => []);
    for (let v = 0; v < width.length; v++) rows[vRank[v]].push(v);  // items come in execution order
    const pos = new Float64Array(width.length);
    const renumber = (row) => { for (let i = 0; i < row.length; i++) pos[row[i]] = i; };
    rows.forEach(renumber);

    // ordering: barycentre sweeps, down then up
    const sortBy = (row, nbrs) => {
      const key = new Map();
      for (const v of row) {
        const list = nbrs[v];
        if (!list.length) { key.set(v, pos[v]); continue; }
        let s = 0;
        for (const w of list) s += pos[w];
        key.set(v, s / list.length);
      }
      row.sort((a, b) => key.get(a) - key.get(b) || pos[a] - pos[b]);
      renumber(row);
    };
    for (let s = 0; s < o.sweeps; s++) {
      for (let r = 1; r < numRanks; r++) sortBy(rows[r], up);
      for (let r = numRanks - 2; r >= 0; r--) sortBy(rows[r], down);
    }

    // x: pack, then pull each node to the mean of its neighbours (order and gaps kept)
    const x = new Float64Array(width.length);
    const gapsOf = (row) => row.slice(1).map((v, i) => (width[row[i]] + width[v]) / 2 + o.nodeGap);
    const rowGaps = rows.map(gapsOf);
    for (const row of rows) {
      let cursor = 0;
      for (const v of row) { x[v] = cursor + width[v] / 2; cursor += width[v] + o.nodeGap; }
    }
    const pull = (r, nbrs) => {
      const row = rows[r];
      if (!row.length) return;
      const want = row.map((v) => {
        const list = nbrs[v];
        if (!list.length) return x[v];
        let s = 0;
        for (const w of list) s += x[w];
        return s / list.length;
      });
      const placed = placeRow(want, rowGaps[r]);
      for (let i = 0; i < row.length; i++) x[row[i]] = placed[i];
    };
    for (let it = 0; it < o.placeIterations; it++) {
      for (let r = 1; r < numRanks; r++) pull(r, up);
      for (let r = numRanks - 2; r >= 0; r--) pull(r, down);
    }
    straighten(rows, rowGaps, x, n, up, down);
    let minX = Infinity, maxX = -Infinity;
    for (let v = 0; v < width.length; v++) { minX = Math.min(minX, x[v] - width[v] / 2); maxX = Math.max(maxX, x[v] + width[v] / 2); }

    // y: rank by rank, each as tall as its tallest item
    const rankTop = new Float64Array(numRanks), rankHeight = new Float64Array(numRanks);
    for (let v = 0; v < n; v++) rankHeight[rank[v]] = Math.max(rankHeight[rank[v]], items[v].h);
    let cursor = 0;
    for (let r = 0; r < numRanks; r++) {
      rankTop[r] = cursor;
      cursor += (rankHeight[r] || 10) + o.rankGap;
    }
    const height = cursor - o.rankGap;
    const outX = [], outY = [];
    for (let v = 0; v < n; v++) { outX.push(x[v] - minX); outY.push(rankTop[rank[v]] + rankHeight[rank[v]] / 2); }
    // a bend (or port) is drawn straight down the whole height of its rank, beside the items
    // there: an edge then turns only in the gaps between ranks, where no item is, and not
    // across the item next to it on a tall rank (an expanded box)
    const across = (v) => {
      const r = vRank[v], top = rankTop[r], h = rankHeight[r];
      return h ? [[x[v] - minX, top], [x[v] - minX, top + h]] : [[x[v] - minX, top + 5]];
    };
    const through = (nodes) => { const out = []; for (const v of nodes) out.push(...across(v)); return out; };
    const routes = new Map();
    for (const [t, h, bends, rev] of chains) {
      const points = through(bends);
      if (rev) { points.reverse(); routes.set(h + ">" + t, points); } else routes.set(t + ">" + h, points);
    }
    const entryRoutes = entryChains.map(([p, linked]) => new Map(linked.map(([h, bends]) => [h, through([p, ...bends])])));
    const exitRoutes = exitChains.map(([p, linked]) => new Map(linked.map(([t, bends]) => [t, through([...bends, p])])));
    return { width: maxX - minX, height, x: outX, y: outY, routes, entryRoutes, exitRoutes, reversed };
  }

  window.TorchlensLayout = { layoutLevel, placeRow };
})();
