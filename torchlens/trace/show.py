"""``show_model_graph``: trace a model (metadata only) and draw it in one call (the package's face:
it uses both the tracer and the drawing, which do not know each other)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Dict, Optional

from ..arguments import check
from .api import get_model_metadata, require_model
from .draw_options import OLD_NAMES, move_old_names, resolve_draw
from .render import STYLE_NAMES, display_svg, in_notebook, refuse_unknown_keywords, render_graph, svg_of


def show_model_graph(
    model: Any,
    input_args: Any,
    input_kwargs: Optional[Dict[str, Any]] = None,
    vis_mode: str = "unrolled",
    vis_nesting_depth: Optional[int] = None,
    vis_direction: Optional[str] = None,
    vis_outpath: Optional[str] = None,
    vis_fileformat: Optional[str] = None,
    vis_save_only: Optional[bool] = None,
    random_seed: Optional[int] = None,
    **render_options: Any,
) -> None:
    """Run ``torchlens.get_model_metadata(model, input_args, input_kwargs)`` and draw the graph.

    ``vis_fileformat='html'`` writes the interactive graph page instead (``vis_outpath + '.html'``,
    see ``ModelHistory.to_html``; shown inline in a notebook unless ``vis_save_only``).
    In a Jupyter notebook the graph is shown inline as SVG (and also written to a file when
    ``vis_outpath`` is given or ``vis_save_only`` is True). Elsewhere it is written to
    ``vis_outpath + '.' + vis_fileformat`` (defaults ``'graph'``, ``'pdf'``) and, unless
    ``vis_save_only``, opened in the system viewer when there is one. Other options
    (``graph_attrs``, ``node_attrs``, ``edge_attrs``, ``module_attrs``, ...) are those of
    ``torchlens.trace.render.render_graph``; like there, the older names ``outpath``, ``fileformat``,
    ``save_only`` and ``direction`` are accepted too. Returns None, so a notebook does not show
    the graph twice.

    Example:
        >>> import os, tempfile, torch
        >>> from torchlens import show_model_graph
        >>> out = os.path.join(tempfile.mkdtemp(), "mlp")
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> show_model_graph(model, torch.rand(2, 4), vis_outpath=out, vis_fileformat="svg", vis_save_only=True)
        >>> os.path.exists(out + ".svg")
        True
    """
    require_model(model, "show_model_graph")
    old_names = {k: render_options.pop(k) for k in list(render_options) if k in OLD_NAMES}
    # before the model runs: a misspelt keyword should not cost a trace first
    own = [n for n, p in inspect.signature(show_model_graph).parameters.items() if p.kind != p.VAR_KEYWORD]
    refuse_unknown_keywords("show_model_graph", render_options, (*STYLE_NAMES, *own))  # own: for suggestions
    given = dict(vis_direction=vis_direction, vis_outpath=vis_outpath, vis_fileformat=vis_fileformat)
    given = move_old_names("show_model_graph", old_names, dict(given, vis_save_only=vis_save_only))
    outpath = given["vis_outpath"]  # None: no file in a notebook
    fileformat = "pdf" if given["vis_fileformat"] is None else given["vis_fileformat"]  # 'html' too: the page
    save_only = bool(given["vis_save_only"])
    check("show_model_graph", vis_outpath=outpath, vis_save_only=given["vis_save_only"], random_seed=random_seed)
    check("show_model_graph", vis_fileformat=None if fileformat == "html" else fileformat)
    shape = {"vis_mode": vis_mode, "vis_nesting_depth": vis_nesting_depth, "vis_direction": given["vis_direction"]}
    draw = resolve_draw("show_model_graph", None, shape)
    history = get_model_metadata(model, input_args, input_kwargs, random_seed=random_seed)
    if fileformat == "html":  # the interactive page (graph_page), not a graphviz drawing
        _html_page(history, outpath, save_only)
        return None
    if in_notebook() and not save_only:
        display_svg(svg_of(history, draw, **render_options))
        if outpath is None:
            return None
        save_only = True
    written = dataclasses.replace(draw, outpath=outpath or "graph", fileformat=fileformat, save_only=save_only)
    render_graph(history, written, **render_options)
    return None


def _html_page(history: Any, outpath: Optional[str], save_only: bool) -> None:
    from .render import iframe_html, to_html

    page = to_html(history, f"{outpath or 'graph'}.html")
    if in_notebook() and not save_only:
        from IPython.display import HTML, display

        display(HTML(iframe_html(page)))
