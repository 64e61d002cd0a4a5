"""Drawing a ``ModelHistory`` as a graph with graphviz (reads the history only, never traces).

- ``build_dot(history, ...)``: the ``graphviz.Digraph`` (DOT source; ``dot`` is not run).
- ``render_graph(history, ...)``: write ``outpath + '.' + fileformat`` (pdf, png, svg, ...).
- ``svg_of(history, ...)``: SVG text, e.g. for inline display in notebooks.
- ``show_model_graph(model, input_args, ...)``: trace (metadata only) and draw in one call.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.render import build_dot
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    >>> print(build_dot(h).source.count(" -> "))
    2
"""
from .graphviz import GraphvizNotFoundError, build_dot, render_graph, svg_of
from .show import show_model_graph
from .structure import CollapsedModule, build_structure

__all__ = [
    "build_dot",
    "render_graph",
    "svg_of",
    "show_model_graph",
    "GraphvizNotFoundError",
    "CollapsedModule",
    "build_structure",
]
