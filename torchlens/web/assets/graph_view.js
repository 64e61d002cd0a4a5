/* torchlens graph page: what is visible (which modules are open, which repeated runs are
 * unfolded, rolled or unrolled) and where it goes. Exposed as window.TorchlensGraphView.
 *
 * The page data (torchlens/render/graph_page/data.py) gives, per mode, the nodes, the edges and
 * the tree of module containers. A visible tree is built from it: boxes (open modules) holding
 * items: "op" (an operation, or a one-operation module drawn as it), "module" (a closed module)
 * and "fold" (a run of look-alike module calls, e.g. 12 transformer layers, shown as one item).
 * Every edge is lifted to the lowest box holding both ends and each box is laid out on its
 * own (graph_layout.js), innermost first; a box whose inside did not change keeps its layout,
 * so opening a module re-lays out that module and its ancestors only. An edge crossing the
 * border of a box below that level gives the box a port (one per item outside: an entry for
 * an outside tail, an exit for an outside head), so the edge is drawn beside the box's own
 * nodes down to (or up from) its end deep inside, through the bends of every level it crosses. */
(function () {
  "use strict";

  const PAD = 12, HEADER = 24, CHAR = 6.6;
  const OP_H = 36, MODULE_H = 40, FOLD_H = 46;

  function textWidth(...texts) {
    let m = 0;
    for (const t of texts) m = Math.max(m, (t || "").length);
    return Math.max(64, Math.round(m * CHAR + 22));
  }

  function shapeText(shape) { return shape ? (shape.length ? shape.join("×") : "scalar") : ""; }

  class GraphModel {
    constructor(data) {
      this.data = data;
      this.mode = "unrolled";
      this.expanded = { unrolled: new Set(), rolled: new Set() };
      this.unfolded = { unrolled: new Set(), rolled: new Set() };
      this.cache = new Map();
      this.nodesIn = {};
      this.holder = {};  // mode -> node -> the container directly holding it
      for (const mode of Object.keys(data.views)) {
        const view = data.views[mode];
        this.nodesIn[mode] = this._nodesIn(view);
        const holder = new Array(view.nodes.length);
        for (const [cid, m] of Object.entries(view.modules)) for (const [k, r] of m.items) if (k === "n") holder[r] = cid;
        this.holder[mode] = holder;
      }
    }

    get view() { return this.data.views[this.mode]; }

    _nodesIn(view) {
      const out = {};
      const visit = (cid) => {
        if (out[cid]) return out[cid];
        const list = [];
        for (const [kind, ref] of view.modules[cid].items) {
          if (kind === "n") list.push(ref); else for (const n of visit(ref)) list.push(n);
        }
        out[cid] = list;
        return list;
      };
      for (const cid of Object.keys(view.modules)) visit(cid);
      return out;
    }

    /** Depth of a container: 0 for the model itself. */
    depthOf(cid) {
      let d = 0;
      for (let c = this.view.modules[cid].parent; c !== null; c = this.view.modules[c].parent) d++;
      return d;
    }

    /** The containers from the model down to the one directly holding node `n`. */
    chainOf(n) {
      const chain = [];
      const modules = this.view.modules;
      for (let c = this.holder[this.mode][n]; c !== null && c !== undefined; c = modules[c].parent) chain.unshift(c);
      return chain;
    }

    /** Open every container on the way to container `cid` (or node `n`), unfolding runs. */
    reveal(target) {
      const modules = this.view.modules;
      const chain = [];
      if (target.node !== undefined) chain.push(...this.chainOf(target.node));
      else for (let c = target.module; c !== null && c !== undefined; c = modules[c].parent) chain.unshift(c);
      const opened = [];
      for (let i = 0; i < chain.length; i++) {
        const cid = chain[i];
        const last = target.module !== undefined && i === chain.length - 1;
        if (cid && !last && !this.expanded[this.mode].has(cid)) { this.expanded[this.mode].add(cid); opened.push(["expand", cid]); }
        if (i + 1 < chain.length) {
          const key = this.foldKeyOf(cid, chain[i + 1]);
          if (key && !this.unfolded[this.mode].has(key)) { this.unfolded[this.mode].add(key); opened.push(["unfold", key]); }
        }
      }
      return opened;
    }

    foldKeyOf(parent, child) {
      const m = this.view.modules[parent];
      const at = m.items.findIndex(([k, r]) => k === "m" && r === child);
      for (const [start, count] of m.folds) if (at >= start && at < start + count) return `${parent}#${start}`;
      return null;
    }

    /** Open all modules up to `depth` (0: only the model's own level), folds kept; groups
     *  of inputs/outputs (a cache) stay closed until clicked. */
    expandToDepth(depth) {
      const set = this.expanded[this.mode];
      set.clear();
      for (const [cid, m] of Object.entries(this.view.modules)) if (cid && !m.group && this.depthOf(cid) < depth) set.add(cid);
    }

    expandAll() {
      for (const cid of Object.keys(this.view.modules)) if (cid) this.expanded[this.mode].add(cid);
      for (const [cid, m] of Object.entries(this.view.modules)) for (const [s] of m.folds) this.unfolded[this.mode].add(`${cid}#${s}`);
    }

    collapseAll() { this.expanded[this.mode].clear(); this.unfolded[this.mode].clear(); }

    // ----- the visible tree -----------------------------------------------------------------
    build() {
      const view = this.view, data = this.data, mode = this.mode;
      const rep = new Array(view.nodes.length);
      const items = new Map();
      const opItem = (n, parent, inline) => {
        const op = data.ops[view.nodes[n].op];
        const label = view.nodes[n].label;
        const passes = view.nodes[n].passes;
        const line2 = [inline ? inline : "", shapeText(op.shape)].filter(Boolean).join(" · ");
        const it = { kind: "op", id: `n:${n}`, node: n, parent, label, line2, w: textWidth(label + (passes > 1 ? ` ×${passes}` : ""), line2), h: OP_H };
        rep[n] = it;
        return it;
      };
      const box = (cid, parent) => {
        const m = view.modules[cid];
        const b = { kind: "box", id: `b:${cid}`, cid, parent, children: [], title: cid ? `${m.address}${m.passes > 1 && m.pass ? `:${m.pass}` : ""} · ${m.type}` : "" };
        items.set(b.id, b);
        const foldAt = new Map(m.folds.map(([s, c]) => [s, c]));
        for (let i = 0; i < m.items.length; i++) {
          const [kind, ref] = m.items[i];
          const count = foldAt.get(i);
          if (count && !this.unfolded[mode].has(`${cid}#${i}`)) {
            const members = m.items.slice(i, i + count).map(([, r]) => r);
            const first = view.modules[members[0]], last = view.modules[members[members.length - 1]];
            const title = `${first.address} … ${last.address}`;
            const f = { kind: "fold", id: `f:${cid}#${i}`, key: `${cid}#${i}`, cid: members[0], members, parent: b, title, type: first.type, count, w: textWidth(title, `${first.type} ×${count}`) + 10, h: FOLD_H };
            for (const c of members) for (const n of this.nodesIn[mode][c]) rep[n] = f;
            b.children.push(f); items.set(f.id, f);
            i += count - 1;
            continue;
          }
          let it;
          if (kind === "n") it = opItem(ref, b, null);
          else if (view.modules[ref].single !== null) it = opItem(view.modules[ref].single, b, view.modules[ref].address);
          else if (this.expanded[mode].has(ref)) it = box(ref, b);
          else {
            const sub = view.modules[ref];
            let name = sub.address + (sub.passes > 1 && sub.pass ? `:${sub.pass}` : "");
            let line2 = `${sub.type} · ${sub.ops} ops  ▸`;
            if (sub.group) {  // the many tensors of one input/output container (a cache): one node
              const first = data.ops[view.nodes[this.nodesIn[mode][ref][0]].op];
              name = `${sub.address} (${sub.ops} tensors)`;
              line2 = `${shapeText(first.shape)} …  ▸`;
            }
            it = { kind: "module", id: `m:${ref}`, cid: ref, parent: b, title: name, type: sub.type, line2, group: !!sub.group, w: textWidth(name, line2), h: MODULE_H };
            for (const n of this.nodesIn[mode][ref]) rep[n] = it;
          }
          b.children.push(it); items.set(it.id, it);
        }
        return b;
      };
      const root = box("", null);
      // edges between visible items, merged; argument positions kept between two operations
      const edges = new Map();
      for (const [t, h, text] of view.edges) {
        const a = rep[t], b = rep[h];
        if (!a || !b || a === b) continue;
        const key = `${a.id}>${b.id}`;
        const e = edges.get(key);
        if (e) { e.count++; continue; }
        edges.set(key, { a, b, text: a.kind === "op" && b.kind === "op" ? text : "", count: 1, t, h });
      }
      return { root, items, rep, edges: [...edges.values()] };
    }

    // ----- layout --------------------------------------------------------------------------
    layout(tree) {
      const depth = (it) => { let d = 0; for (let p = it.parent; p; p = p.parent) d++; return d; };
      const perBox = new Map(), portsOf = new Map();
      for (const e of tree.edges) {  // lift the edge to the lowest box holding both ends
        let a = e.a, b = e.b, da = depth(a), db = depth(b);
        while (da > db) { a = a.parent; da--; }
        while (db > da) { b = b.parent; db--; }
        while (a.parent !== b.parent) { a = a.parent; b = b.parent; }
        if (a === b) continue;
        e.la = a; e.lb = b;
        e.level = a.parent;
        if (!perBox.has(a.parent)) perBox.set(a.parent, []);
        perBox.get(a.parent).push([a, b]);
        e.leaving = bordersCrossed(e.a, e.level, e.b.id, "exits", portsOf);
        e.entering = bordersCrossed(e.b, e.level, e.a.id, "entries", portsOf).reverse();
      }
      let computed = 0;
      const layBox = (box) => {
        for (const c of box.children) if (c.kind === "box") layBox(c);
        const index = new Map(box.children.map((c, i) => [c, i]));
        box.index = index;
        const edges = (perBox.get(box) || []).map(([a, b]) => [index.get(a), index.get(b)]);
        if (box.cid && this.view.modules[box.cid].group) {
          // an open group (a cache) has no edges inside: a grid, not one row 24 tensors wide
          // (links that place the rows, never drawn)
          const n = box.children.length, cols = Math.max(2, 2 * Math.round(Math.sqrt(n) / 2));
          for (let i = 0; i + cols < n; i++) edges.push([i, i + cols]);
        }
        const ports = portsOf.get(box) || { entries: new Map(), exits: new Map() };
        const entries = portLists(ports.entries, index), exits = portLists(ports.exits, index);
        // the port lists hold child indices only: renamed outside items keep the layout
        box.portAt = { entries: new Map(entries.map(([key], i) => [key, i])), exits: new Map(exits.map(([key], i) => [key, i])) };
        const lists = { entries: entries.map(([, l]) => l), exits: exits.map(([, l]) => l) };
        const signature = box.children.map((c) => `${c.id}/${c.w}/${c.h}`).join(",") + "|" + edges.map((e) => e.join(">")).join(",")
          + "|" + lists.entries.join(";") + "|" + lists.exits.join(";");
        const cacheKey = `${this.mode}|${box.id}`;
        let cached = this.cache.get(cacheKey);
        if (!cached || cached.signature !== signature) {
          cached = { signature, result: window.TorchlensLayout.layoutLevel(box.children, edges, lists) };
          this.cache.set(cacheKey, cached);
          computed++;
        }
        box.layout = cached.result;
        const pad = box.parent ? PAD : 0;
        box.w = Math.max(box.layout.width + 2 * pad, box.parent ? textWidth(box.title) : 0);
        box.h = box.layout.height + 2 * pad + (box.parent ? HEADER : 0);
        box.inset = (box.w - box.layout.width) / 2;
      };
      layBox(tree.root);
      const place = (box, ox, oy) => {
        box.x = ox; box.y = oy;
        const top = oy + (box.parent ? HEADER + PAD : 0);
        box.children.forEach((c, i) => {
          const cx = ox + box.inset + box.layout.x[i], cy = top + box.layout.y[i];
          if (c.kind === "box") place(c, cx - c.w / 2, cy - c.h / 2);
          else { c.x = cx - c.w / 2; c.y = cy - c.h / 2; }
        });
        box.origin = [ox + box.inset, top];
      };
      place(tree.root, 0, 0);
      for (const e of tree.edges) {
        const route = e.level ? e.level.layout.routes.get(`${e.level.index.get(e.la)}>${e.level.index.get(e.lb)}`) : null;
        const bends = shifted(route, e.level);
        const up = e.b.y + e.b.h <= e.a.y;  // a loop back (rolled view)
        const start = [e.a.x + e.a.w / 2, up ? e.a.y : e.a.y + e.a.h];
        const end = [e.b.x + e.b.w / 2, up ? e.b.y + e.b.h : e.b.y];
        // ports lie on the top and bottom of boxes: of no use to an edge drawn upwards
        if (up || !e.level) e.points = [start, ...bends, end];
        else e.points = [start, ...portPoints(e.leaving, e.b.id, "exits"), ...bends, ...portPoints(e.entering, e.a.id, "entries"), end];
      }
      return { width: tree.root.w, height: tree.root.h, boxesLaidOut: computed };
    }
  }

  /** The boxes an edge end `item` is in, below `level`, innermost first, as [box, child of the
   *  box holding the end]; each gets a port (`side`) keyed by the other end `key`. */
  function bordersCrossed(item, level, key, side, portsOf) {
    const path = [];
    for (let c = item; c.parent !== level; c = c.parent) {
      const box = c.parent;
      if (!portsOf.has(box)) portsOf.set(box, { entries: new Map(), exits: new Map() });
      const ports = portsOf.get(box)[side];
      if (!ports.has(key)) ports.set(key, new Set());
      ports.get(key).add(c);
      path.push([box, c]);
    }
    return path;
  }

  /** [key, sorted child indices] of each port, in an order that depends on the indices only
   *  (so that the layout cache sees the same ports as the same). */
  function portLists(ports, index) {
    const lists = [...ports].map(([key, set]) => [key, [...set].map((c) => index.get(c)).sort((p, q) => p - q)]);
    return lists.sort((p, q) => compareLists(p[1], q[1]));
  }

  function compareLists(p, q) {
    for (let i = 0; i < Math.min(p.length, q.length); i++) if (p[i] !== q[i]) return p[i] - q[i];
    return p.length - q.length;
  }

  /** Points of a box's layout in page coordinates. */
  function shifted(points, box) {
    if (!points || !box) return [];
    const [ox, oy] = box.origin;
    return points.map(([x, y]) => [x + ox, y + oy]);
  }

  /** The points of an edge through the ports of the boxes it crosses, in drawing order. */
  function portPoints(path, key, side) {
    const out = [];
    for (const [box, child] of path) {
      const routes = box.layout[side === "entries" ? "entryRoutes" : "exitRoutes"][box.portAt[side].get(key)];
      for (const p of shifted(routes.get(box.index.get(child)), box)) out.push(p);
    }
    return out;
  }

  /** SVG path data through points with vertical tangents (smooth top-to-bottom edges). */
  function smoothPath(points) {
    let d = `M${points[0][0].toFixed(1)},${points[0][1].toFixed(1)}`;
    for (let i = 1; i < points.length; i++) {
      const [x0, y0] = points[i - 1], [x1, y1] = points[i];
      const dy = (y1 - y0) / 2;
      d += ` C${x0.toFixed(1)},${(y0 + dy).toFixed(1)} ${x1.toFixed(1)},${(y1 - dy).toFixed(1)} ${x1.toFixed(1)},${y1.toFixed(1)}`;
    }
    return d;
  }

  window.TorchlensGraphView = { GraphModel, smoothPath, shapeText };
})();
