"""``show_model_graph``: trace a model (metadata only) and draw it in one call."""
from __future__ import annotations

from typing import Any, Dict, Optional

from .graphviz import display_svg, in_notebook, render_graph, svg_of


def show_model_graph(model: Any, input_args: Any, input_kwargs: Optional[Dict[str, Any]] = None,
                     vis_mode: str = "unrolled", vis_nesting_depth: Optional[int] = None,
                     direction: str = "bottomup", outpath: Optional[str] = None, fileformat: str = "pdf",
                     save_only: bool = False, random_seed: Optional[int] = None, **render_options: Any) -> None:
    """Run ``torchlens.get_model_metadata(model, input_args, input_kwargs)`` and draw the graph.

    In a Jupyter notebook the graph is shown inline as SVG (and also written to a file when
    ``outpath`` is given or ``save_only`` is True). Elsewhere it is written to
    ``outpath + '.' + fileformat`` (``outpath`` defaults to ``'graph'``) and, unless
    ``save_only``, opened in the system viewer when there is one. Other options
    (``graph_attrs``, ``node_attrs``, ``edge_attrs``, ``module_attrs``, ...) are those of
    ``torchlens.render.render_graph``. Returns None, so a notebook does not show the graph twice.

    Example:
        >>> import os, tempfile, torch
        >>> from torchlens.render import show_model_graph
        >>> out = os.path.join(tempfile.mkdtemp(), "mlp")
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> show_model_graph(model, torch.rand(2, 4), outpath=out, fileformat="svg", save_only=True)
        >>> os.path.exists(out + ".svg")
        True
    """
    from ..api import get_model_metadata  # imported here: torchlens/__init__ may import this module

    history = get_model_metadata(model, input_args, input_kwargs, random_seed=random_seed)
    options = dict(vis_mode=vis_mode, vis_nesting_depth=vis_nesting_depth, direction=direction, **render_options)
    if in_notebook() and not save_only:
        display_svg(svg_of(history, **options))
        if outpath is None:
            return None
        save_only = True
    render_graph(history, outpath=outpath or "graph", fileformat=fileformat, save_only=save_only, **options)
    return None
