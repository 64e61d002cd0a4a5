"""Drawing a ``ModelHistory`` as a graph with graphviz (reads the history only, never traces).

- ``build_dot(history, ...)``: the ``graphviz.Digraph`` (DOT source; ``dot`` is not run).
- ``render_graph(history, ...)``: write ``outpath + '.' + fileformat`` (pdf, png, svg, ...).
- ``svg_of(history, ...)``: SVG text, e.g. for inline display in notebooks.

Each takes ``draw=DrawOptions(...)`` (what to draw, where; ``torchlens.DrawOptions``) and
``style=GraphStyle(...)`` (graphviz attribute overrides, extra edges, module boxes), or their
fields as keywords (``vis_mode=``, ``node_attrs=``, ...).

``torchlens.show_model_graph`` (trace, then draw) lives in the package's face: drawing never traces.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render import build_dot
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    >>> print(build_dot(h).source.count(" -> "))
    2
"""

from ..history.extensions import provide
from . import cards  # noqa: F401  (registers the notebook card of an entry)
from .graph_page import iframe_html, inline_svg, mimebundle, notebook_html, page_data, show, to_html
from .graphviz import GraphvizNotFoundError, build_dot, display_svg, in_notebook, render_graph, svg_of
from .options import STYLE_NAMES, GraphStyle, refuse_unknown_keywords
from .structure import CollapsedModule, build_structure

provide("svg", inline_svg)
provide("to_html", to_html)
provide("show", show)
provide("notebook_html", notebook_html)
provide("mimebundle", mimebundle)

__all__ = [
    "build_dot",
    "render_graph",
    "svg_of",
    "GraphStyle",
    "STYLE_NAMES",
    "refuse_unknown_keywords",
    "GraphvizNotFoundError",
    "CollapsedModule",
    "build_structure",
    "to_html",
    "iframe_html",
    "page_data",
    "in_notebook",
    "display_svg",
]
