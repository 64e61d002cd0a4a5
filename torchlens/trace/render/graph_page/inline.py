"""The graph page inside a notebook output: ``notebook_html`` (the packed page in an iframe's
``srcdoc``: no server, no network, isolated from the notebook's CSS and JS, laid out only once
scrolled into view) and ``mimebundle`` (what ``ModelHistory`` gives Jupyter: the page for front
ends that run JavaScript, the SVG drawing for those that do not, the summary text for all).

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render.graph_page.inline import notebook_html
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    >>> frame = notebook_html(h, height=300)
    >>> frame.startswith("<iframe srcdoc=") and "height: 300px" in frame and 'loading="lazy"' in frame
    True
"""

from __future__ import annotations

import html as _html
from typing import TYPE_CHECKING, Any, Dict, Optional

from ....web.embed import packed_page, srcdoc_frame
from .data import page_data

if TYPE_CHECKING:
    from ...history.model_history import ModelHistory

DEFAULT_HEIGHT = 640
# The SVG drawing rides along for renderers without JavaScript (GitHub, nbconvert to PDF) only
# while it stays small: a GPT-2's drawing is 780 KB, more than its whole packed page.
SVG_MAX_OPS = 300
SVG_MAX_CHARS = 400_000


def notebook_page(history: "ModelHistory", **options: Any) -> str:
    """The graph page packed for embedding (see ``torchlens.web.embed.packed_page``);
    ``options`` go to ``page_data``."""
    page = packed_page("graph.html", page_data(history, **options), "TORCHLENS_GRAPH")
    return page.replace(
        "<title>torchlens graph</title>", f"<title>{_html.escape(history.model_name)} · torchlens graph</title>"
    )


def notebook_html(history: "ModelHistory", height: int = DEFAULT_HEIGHT, **options: Any) -> str:
    """The HTML of the inline graph page of ``history`` (an iframe; see the module doc)."""
    return srcdoc_frame(notebook_page(history, **options), height)


def inline_svg(history: "ModelHistory") -> Optional[str]:
    """The graphviz drawing as SVG for a notebook output (``ModelHistory._repr_svg_``), or None
    (the front end falls back to the page or the text) without ``dot``, or when the graph has
    more than ``SVG_MAX_OPS`` operations or its SVG more than ``SVG_MAX_CHARS`` characters."""
    if len(history) > SVG_MAX_OPS:
        return None
    from ..graphviz import GraphvizNotFoundError, svg_of

    try:
        svg = svg_of(history)
    except GraphvizNotFoundError:
        return None
    return svg if len(svg) <= SVG_MAX_CHARS else None


def mimebundle(history: "ModelHistory", include: Any = None, exclude: Any = None) -> Dict[str, str]:
    """``ModelHistory._repr_mimebundle_``: ``text/plain`` (the summary), ``text/html`` (the inline
    page) and, while small, ``image/svg+xml`` (the drawing); ``include``/``exclude`` are the MIME
    types Jupyter asks for or not.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> sorted(mimebundle(h, include=["text/plain", "text/html"]))
        ['text/html', 'text/plain']
    """

    def wanted(kind: str) -> bool:
        return (not include or kind in include) and not (exclude and kind in exclude)

    bundle = {"text/plain": str(history)} if wanted("text/plain") else {}
    if wanted("text/html"):
        bundle["text/html"] = notebook_html(history)
    if wanted("image/svg+xml"):
        svg = inline_svg(history)
        if svg is not None:
            bundle["image/svg+xml"] = svg
    return bundle


def show(history: "ModelHistory", height: int = DEFAULT_HEIGHT, **options: Any) -> None:
    """Display the page inline in Jupyter (once: it returns None, so ``h.show()`` ending a cell
    is not shown again as the cell's value); outside a notebook, raise a ``RuntimeError``
    suggesting ``to_html(path)``.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> show(h, height=400)  # doctest: +SKIP
    """
    from ..graphviz import in_notebook

    if not in_notebook():
        raise RuntimeError(
            "history.show() displays the graph in a Jupyter notebook; elsewhere write a file with "
            "history.to_html('graph.html') and open it in a browser."
        )
    from IPython.display import display

    # raw: IPython's HTML object warns about an <iframe> ("consider IFrame"); the page is one
    display({"text/html": notebook_html(history, height, **options)}, raw=True)


__all__ = ["notebook_page", "notebook_html", "mimebundle", "inline_svg", "show", "DEFAULT_HEIGHT"]
