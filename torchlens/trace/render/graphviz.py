"""Draw a ``ModelHistory`` with graphviz: ``build_dot`` (DOT source only), ``render_graph`` (a file).

The renderer reads the history only; it never traces. ``build_dot`` needs the ``graphviz``
Python package but not the ``dot`` program; ``render_graph`` and ``svg_of`` run ``dot`` and raise
``GraphvizNotFoundError`` (a ``RuntimeError``) with install instructions when it is missing.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render import build_dot
    >>> block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    >>> h = tl.log_forward_pass(torch.nn.Sequential(block), torch.ones(1, 3), random_seed=0)
    >>> dot = build_dot(h, vis_direction="topdown")
    >>> "subgraph cluster_0 {" in dot.source, "input_1_0 -> linear_1_1" in dot.source
    (True, True)
"""

from __future__ import annotations

import contextlib
import html
import os
import shutil
import sys
import threading
from typing import Any, Dict, Iterable, List, Optional

import graphviz

from ...arguments import require_instance
from ...errors import TorchlensError
from ..draw_options import DrawOptions
from ..history.model_history import ModelHistory
from ..history.rolled import RolledLayer
from ..records.format import human_bytes
from ..records.visible_text import visible
from . import style as st
from .fans import Junction
from .groups import TensorGroup
from .options import DOT_VIS_NAMES, AttrOverrides, GraphStyle, read_options
from .structure import Cluster, CollapsedModule, ExtraEdge, GraphStructure, Node, build_structure

PROGRESS_THRESHOLD = 500  # graphs with more nodes than this show progress while built and while dot runs

INSTALL_HELP = (
    "Drawing the graph needs Graphviz's `dot` program, which was not found on the PATH "
    "(the `graphviz` Python package alone is not enough). The history itself is fine; only "
    "drawing failed. Install Graphviz with one of:\n"
    "    Debian/Ubuntu:  sudo apt install graphviz\n"
    "    macOS:          brew install graphviz\n"
    "    conda:          conda install -c conda-forge graphviz\n"
    "then run the drawing again."
)


class GraphvizNotFoundError(TorchlensError, RuntimeError):
    """Graphviz's ``dot`` program is not installed (or not on the PATH).

    ``history`` is None, or the ``ModelHistory`` whose drawing failed when the error comes from a
    call that also traced (so the traced history is not lost).
    """

    def __init__(self, message: str = INSTALL_HELP, history: "ModelHistory" = None) -> None:
        super().__init__(message)
        self.history = history


class GraphvizFailedError(TorchlensError, RuntimeError):
    """Graphviz's ``dot`` ran but could not draw the graph; the message gives what it said."""


# ----- looks of nodes, edges and boxes -----------------------------------------------------------
def _any(item: Any, flag: str) -> bool:
    entries = item.passes if isinstance(item, RolledLayer) else [item]
    return any(bool(getattr(e, flag, False)) for e in entries)


def _tensor_lines(item: Any) -> list:
    entries = item.passes if isinstance(item, RolledLayer) else [item]
    texts = list(dict.fromkeys(st.tensor_text(e.shape, e.dtype, e.nbytes) for e in entries))
    return [" / ".join(texts[:3]) + (" / ..." if len(texts) > 3 else "")]


def _entry_look(item: Any, rolled: bool, inline_modules: list) -> Dict[str, str]:
    kind = item.kind
    if kind in ("input", "output", "buffer", "untraced"):
        look = kind
    elif _any(item, "bool_used"):
        look = "bool"
    elif item.param_shapes:
        look = "params"
    else:
        look = "op"
    title = item.label
    if rolled and item.num_passes > 1:
        title += f" (x{item.num_passes})"
    first = item.passes[0] if isinstance(item, RolledLayer) else item
    notes = [f"{label} ({module_type})" for label, module_type in inline_modules]
    if kind in ("input", "output", "buffer") and first.address and first.address != "output":
        notes.append(str(first.address))
    if look == "bool":
        notes.append("used as a condition")
    if getattr(first, "gradient_note", None):
        notes.append("no gradient (reentrant checkpoint)")
    if getattr(first, "call_outputs", None) and first.label in first.call_outputs:  # one call, several outputs
        notes.append(f"output {first.call_outputs.index(first.label) + 1} of {len(first.call_outputs)} of one call")
    if look == "untraced":
        notes.append("untraced producer: inputs unknown")
    if _any(item, "intervened"):
        notes.append("intervened: value replaced")
    lines = _tensor_lines(item)
    if item.param_shapes:
        lines.append("params: " + ", ".join(st.shape_text(s) for s in item.param_shapes))
    attrs = {"label": st.html_label(title, lines, notes)}
    if look != "op":
        attrs["fillcolor"], attrs["color"] = st.COLORS[look]
    if _any(item, "created_inside_model"):
        attrs["style"] = "filled,rounded,dashed"
    if _any(item, "intervened"):  # a changed value: a thick border in its own colour
        attrs["color"], attrs["penwidth"] = st.INTERVENED_BORDER, "3.0"
    if look == "untraced":  # a gap in the trace: impossible to miss, also in grayscale
        attrs["style"], attrs["penwidth"], attrs["shape"] = "filled,dashed,bold", "2.0", "octagon"
    return attrs


def _module_node_look(module: CollapsedModule, rolled: bool) -> Dict[str, str]:
    title = module.label + (f" (x{module.num_passes})" if rolled and module.num_passes > 1 else "")
    lines = [module.module_type]
    outs = [st.tensor_text(shape, dtype, nbytes) for shape, dtype, nbytes in module.outputs[:3]]
    if outs:
        lines.append("out: " + " / ".join(outs) + (" / ..." if len(module.outputs) > 3 else ""))
    counts = f"{module.num_ops} op" + ("" if module.num_ops == 1 else "s")
    if module.num_params:
        counts += ", " + st.params_text(module.num_params)
    lines.append(counts)
    fill, border = st.COLORS["module"]
    return {
        "label": st.html_label(title, lines),
        "shape": "box3d",
        "style": "filled",
        "fillcolor": fill,
        "color": border,
    }


def _group_node_look(group: TensorGroup) -> Dict[str, str]:
    """One node for the many tensors of one input/output container (a cache), with their count."""
    texts = list(dict.fromkeys(st.shape_text(shape) for shape in group.shapes if shape is not None))
    lines = [" / ".join(texts[:2]) + (" / ..." if len(texts) > 2 else ""), human_bytes(group.nbytes)]
    fill, border = st.COLORS[group.kind]
    return {
        "label": st.html_label(group.title, [line for line in lines if line]),
        "shape": "folder",
        "style": "filled",
        "fillcolor": fill,
        "color": border,
    }


def _cluster_label(cluster: Cluster, rolled: bool) -> str:
    name = cluster.address
    if not rolled and cluster.num_passes > 1:
        name += f":{cluster.pass_num}"
    extra = f" (x{cluster.num_passes})" if rolled and cluster.num_passes > 1 else ""
    return f'<<B>{html.escape(name)}</B>  <FONT COLOR="#8a929c">{html.escape(cluster.module_type)}{extra}</FONT>>'


def _overrides(overrides: AttrOverrides, *args: Any) -> Dict[str, str]:
    out = {}
    for key, value in (overrides or {}).items():
        resolved = value(*args) if callable(value) else value
        if resolved is not None:
            out[key] = resolved if isinstance(resolved, str) else str(resolved)
    return out


def _title(history: "ModelHistory", structure: GraphStructure) -> str:
    num = len(history.layer_list)
    tensor_bytes = sum(e.nbytes or 0 for e in history.layer_list)
    params = {a: n for node in structure.nodes.values() for a, n in _param_numels(node)}
    mode = "rolled" if structure.rolled else "unrolled"
    detail = f"{num} tensors ({human_bytes(tensor_bytes)}), {st.params_text(sum(params.values()))}; {mode}"
    return (
        f"<<B>{html.escape(str(history.model_name))}</B><BR/>"
        f'<FONT POINT-SIZE="9" COLOR="{st.DETAIL_COLOR}">{html.escape(detail)}</FONT>>'
    )


def _param_numels(node: Node) -> Iterable:
    item = node.item
    if isinstance(item, CollapsedModule):
        return item.param_numels.items()
    if isinstance(item, (Junction, TensorGroup)):
        return ()
    out = []
    for address, shape in zip(item.param_addresses or (), item.param_shapes or ()):
        n = 1
        for d in shape:
            n *= int(d)
        out.append((address, n))
    return out


# ----- DOT ----------------------------------------------------------------------------------------
def _emit(structure: GraphStructure, cluster: Cluster, graph: graphviz.Digraph, opts: Dict[str, Any]) -> None:
    rolled = structure.rolled
    for node in cluster.nodes:
        item = node.item
        if isinstance(item, Junction):  # not the user's node: no overrides
            graph.node(node.id, **st.JUNCTION)
            continue
        if isinstance(item, CollapsedModule):
            attrs = _module_node_look(item, rolled)
        elif isinstance(item, TensorGroup):
            attrs = _group_node_look(item)
        else:
            attrs = _entry_look(item, rolled, node.inline_modules)
        attrs.update(_overrides(opts["node_attrs"], item))
        graph.node(node.id, **attrs)
    for key in cluster.children:
        child = structure.clusters[key]
        sub = graphviz.Digraph(name=child.id)
        # graphviz flips cluster labels with rankdir=BT: 'b' puts them at the top of the box.
        attrs = dict(st.CLUSTER_DEFAULTS, label=_cluster_label(child, rolled), labelloc=opts["labelloc"])
        attrs.update(_overrides(opts["module_attrs"], child.address))
        sub.attr(**attrs)
        _emit(structure, child, sub, opts)
        graph.subgraph(sub)
    for edge in cluster.edges:
        attrs = {}
        if edge.kind == "if":
            attrs.update(st.IF_EDGE)
        label = edge.label_text(rolled)
        if label:
            attrs["label"] = st.clip(label).replace("\n", "\\n")  # DOT's own line break escape
        attrs.update(edge.attrs)
        tail, head = edge.ends or (edge.tail.item, edge.head.item)
        if not isinstance(tail, Junction) and not isinstance(head, Junction):
            attrs.update(_overrides(opts["edge_attrs"], tail, head))
        graph.edge(edge.tail.id, edge.head.id, **attrs)


def _progress_bar(items: list) -> Iterable:
    from tqdm.auto import tqdm

    return tqdm(items, desc="torchlens: building graph", unit="node", leave=False)


def build_dot(
    history: "ModelHistory",
    draw: Optional[DrawOptions] = None,
    style: Optional[GraphStyle] = None,
    **options: Any,
) -> graphviz.Digraph:
    """The graph of ``history`` as a ``graphviz.Digraph`` (DOT source only; ``dot`` is not run).

    Args:
        history: a ``ModelHistory``.
        draw: a ``torchlens.DrawOptions``; of it ``build_dot`` uses ``mode``, ``nesting_depth``
            and ``direction`` (it writes no file). Or, instead, the keywords ``vis_mode``
            (``'unrolled'``: one node per pass of each layer; ``'rolled'``: one node per layer),
            ``vis_nesting_depth`` and ``vis_direction`` (the older name ``direction=`` too).
        style: a ``GraphStyle`` (graphviz attribute overrides, extra edges, module boxes,
            gradients, progress); or, instead, its fields as keywords: ``graph_attrs``,
            ``node_attrs``, ``edge_attrs``, ``module_attrs``, ``extra_edges``, ``progress``,
            ``inline_single_op_modules``, ``show_gradients`` (see ``GraphStyle``).

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> dot = build_dot(h, node_attrs={"fillcolor": lambda e: "pink" if e.kind == "op" else None})
        >>> 'fillcolor=pink' in dot.source
        True
    """
    draw, style = read_options("build_dot", draw, style, options, vis_names=DOT_VIS_NAMES)
    require_instance("history", history, "build_dot", ModelHistory, takes="a ModelHistory")
    return _dot(history, draw, style)


def _dot(history: "ModelHistory", draw: DrawOptions, style: GraphStyle) -> graphviz.Digraph:
    """``build_dot`` of checked options."""
    extra_edges = style.extra_edges
    show_gradients = style.show_gradients
    if show_gradients is None:
        show_gradients = any(getattr(e, "gradient", None) is not None for e in history.layer_list)
    if show_gradients:
        extra_edges = list(extra_edges or ()) + backward_edges(history)
    count = len(history.rolled_layers) if draw.mode == "rolled" else len(history.layer_list)
    show_progress = style.progress if style.progress is not None else count > PROGRESS_THRESHOLD
    structure = build_structure(
        history,
        draw.mode,
        draw.nesting_depth,
        extra_edges,
        progress=_progress_bar if show_progress else None,
        inline_single_op_modules=style.inline_single_op_modules,
    )
    graph_defaults = dict(st.GRAPH_DEFAULTS, rankdir=st.DIRECTIONS[draw.direction], label=_title(history, structure))
    graph_defaults.update(_overrides(style.graph_attrs, history))
    dot = graphviz.Digraph(
        name=str(history.model_name),
        graph_attr=graph_defaults,
        node_attr=dict(st.NODE_DEFAULTS),
        edge_attr=dict(st.EDGE_DEFAULTS),
    )
    opts = {
        "node_attrs": style.node_attrs,
        "edge_attrs": style.edge_attrs,
        "module_attrs": style.module_attrs,
        "labelloc": "b" if draw.direction == "bottomup" else "t",
    }
    _emit(structure, structure.clusters[()], dot, opts)
    # names from a loaded history may hold control characters: dot rejects some, none is meant
    dot.body[:] = [visible(line) for line in dot.body]
    dot.graph_attr.update({k: visible(v) for k, v in dot.graph_attr.items() if isinstance(v, str)})
    dot.name = visible(dot.name)
    return dot


def backward_edges(history: "ModelHistory") -> List[ExtraEdge]:
    """Child -> parent edges along which the gradient flowed (both ends have a gradient)."""
    edges: List[ExtraEdge] = []
    for entry in history.layer_list:
        if getattr(entry, "gradient", None) is None:
            continue
        for parent in entry.parent_layers:
            if parent in history and getattr(history[parent], "gradient", None) is not None:
                edges.append((entry.label, parent, dict(st.BACKWARD_EDGE)))
    return edges


# ----- running dot --------------------------------------------------------------------------------
def run_dot(dot: graphviz.Digraph, fileformat: str, progress: Optional[bool] = None) -> bytes:
    """The drawing as bytes in ``fileformat``; ``GraphvizNotFoundError`` if ``dot`` is missing.

    While ``dot`` lays out a large graph (more than ``PROGRESS_THRESHOLD`` nodes) for more than a
    second, a line on stderr says what it is doing and for how long so far; ``progress=True``
    shows it at once, ``progress=False`` never.
    """
    if shutil.which("dot") is None:
        raise GraphvizNotFoundError()
    edges = sum(1 for line in dot.body if " -> " in line)
    nodes = sum(
        1
        for line in dot.body
        if " -> " not in line
        and line.startswith("\t")
        and " [" in line
        and not line.lstrip().startswith(("graph ", "node ", "edge "))
    )
    show = progress if progress is not None else nodes > PROGRESS_THRESHOLD
    try:
        with _DotTimer(nodes, edges, 0.0 if progress else 1.0) if show else contextlib.nullcontext():
            return dot.pipe(format=fileformat)
    except graphviz.ExecutableNotFound as error:
        raise GraphvizNotFoundError() from error
    except graphviz.CalledProcessError as error:
        said = (error.stderr or b"").decode("utf-8", "replace").strip()
        raise GraphvizFailedError(
            f"graphviz's dot could not draw this graph ({visible(said)[:500] or f'exit status {error.returncode}'}); "
            "if the history was loaded from a folder, its names may be damaged: load it again or trace the model again."
        ) from None


class _DotTimer:
    """A tqdm line with the elapsed time, refreshed from a thread while ``dot`` runs; it appears
    only once ``dot`` has run for ``delay`` seconds (quick layouts stay silent)."""

    def __init__(self, nodes: int, edges: int, delay: float = 1.0) -> None:
        self.desc = (
            f"torchlens: graphviz's dot is laying out {nodes:,} nodes and {edges:,} edges (large graphs "
            "take a while; vis_mode='rolled' or vis_nesting_depth draw fewer nodes)"
        )
        self.delay = delay
        self.done = threading.Event()
        self.bar: Any = None

    def __enter__(self) -> "_DotTimer":
        self.thread = threading.Thread(target=self._tick, daemon=True)
        self.thread.start()
        return self

    def _tick(self) -> None:
        if self.done.wait(self.delay):
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(total=None, desc=self.desc, bar_format="{desc}: {elapsed}", leave=True, initial=0, miniters=0)
        while not self.done.wait(0.5):
            self.bar.refresh()

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        if self.bar is not None:
            self.bar.refresh()
            self.bar.close()


def in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel), where SVG shows inline."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython module without a usable get_ipython
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def display_svg(svg: str) -> None:
    """Show SVG inline in the running notebook."""
    from IPython.display import SVG, display

    display(SVG(svg))


def svg_of(
    history: "ModelHistory", draw: Optional[DrawOptions] = None, style: Optional[GraphStyle] = None, **options: Any
) -> str:
    """The drawing as SVG text (for ``_repr_svg_`` in notebooks); options as for ``build_dot``.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> svg_of(h, vis_mode="rolled").lstrip().startswith("<?xml")
        True
    """
    draw, style = read_options("svg_of", draw, style, options, vis_names=DOT_VIS_NAMES)
    require_instance("history", history, "svg_of", ModelHistory, takes="a ModelHistory")
    return run_dot(_dot(history, draw, style), "svg", style.progress).decode("utf-8")


def render_graph(
    history: "ModelHistory",
    draw: Optional[DrawOptions] = None,
    style: Optional[GraphStyle] = None,
    **options: Any,
) -> graphviz.Digraph:
    """Draw ``history`` to ``draw.outpath + '.' + draw.fileformat``; returns the ``graphviz.Digraph``.

    ``draw`` is a ``torchlens.DrawOptions`` (mode, nesting depth, direction, file path without
    extension (default ``'graph'``), format (``'pdf'`` (default), ``'png'``, ``'svg'``, ...), and
    ``save_only``: when False (default) the drawing is shown too -- inline in a notebook,
    otherwise in the system viewer if there is one (no viewer is not an error)). Instead of
    ``draw`` the keywords of ``log_forward_pass`` work too: ``vis_mode``, ``vis_nesting_depth``,
    ``vis_direction``, ``vis_outpath``, ``vis_fileformat``, ``vis_save_only`` (and the older
    ``outpath``, ``fileformat``, ``save_only``, ``direction``; a ``TypeError`` if both spellings
    are given). ``style`` (or its keywords) is as for ``build_dot``.

    Example:
        >>> import os, tempfile, torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> out = os.path.join(tempfile.mkdtemp(), "linear")
        >>> _ = render_graph(h, vis_outpath=out, vis_fileformat="svg", vis_save_only=True)
        >>> os.path.exists(out + ".svg")
        True
        >>> _ = render_graph(h, draw=tl.DrawOptions(outpath=out, fileformat="png", save_only=True))
        >>> os.path.exists(out + ".png")
        True
    """
    draw, style = read_options("render_graph", draw, style, options)
    require_instance("history", history, "render_graph", ModelHistory, takes="a ModelHistory")
    dot = _dot(history, draw, style)
    data = run_dot(dot, draw.fileformat, style.progress)
    path = f"{draw.outpath}.{draw.fileformat}"
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
    if not draw.save_only:
        _show(dot, path, data if draw.fileformat == "svg" else None)
    return dot


def _show(dot: graphviz.Digraph, path: str, svg: Optional[bytes]) -> None:
    """Show the drawing written to ``path``: inline in a notebook (``svg``: its SVG when the file
    is one), otherwise in the system viewer."""
    if in_notebook():
        display_svg((svg if svg is not None else run_dot(dot, "svg")).decode("utf-8"))
        return
    try:
        graphviz.view(path, quiet=True)
    except Exception:  # no viewer (headless machine): the file is written, that is enough
        pass
