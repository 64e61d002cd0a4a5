"""Drawing a ``ModelHistory`` as a graph with graphviz (reads the history only, never traces).

- ``build_dot(history, ...)``: the ``graphviz.Digraph`` (DOT source; ``dot`` is not run).
- ``render_graph(history, ...)``: write ``outpath + '.' + fileformat`` (pdf, png, svg, ...).
- ``svg_of(history, ...)``: SVG text, e.g. for inline display in notebooks.

``torchlens.show_model_graph`` (trace, then draw) lives in the package's face: drawing never traces.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render import build_dot
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    >>> print(build_dot(h).source.count(" -> "))
    2
"""

from ..history.extensions import provide
from .graph_page import show, to_html
from .graphviz import GraphvizNotFoundError, build_dot, render_graph, svg_of
from .structure import CollapsedModule, build_structure


def _svg_or_none(history):
    """``ModelHistory._repr_svg_``: the drawing, or None (the text summary) without ``dot``."""
    try:
        return svg_of(history)
    except GraphvizNotFoundError:
        return None


provide("svg", _svg_or_none)
provide("to_html", to_html)
provide("show", show)

__all__ = [
    "build_dot",
    "render_graph",
    "svg_of",
    "GraphvizNotFoundError",
    "CollapsedModule",
    "build_structure",
]
