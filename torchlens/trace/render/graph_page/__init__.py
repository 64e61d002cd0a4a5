"""The interactive op-level graph page of a ``ModelHistory``: ``to_html`` (one offline file),
``show`` (inline in Jupyter) and ``page_data`` (the data it is drawn from).

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render.graph_page import page_data
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    >>> sorted(page_data(h)["views"])
    ['rolled', 'unrolled']
"""

from ....web.stats import tensor_stats
from .data import page_data
from .inline import inline_svg, mimebundle, notebook_html, show
from .overlay import Overlay, OverlayError
from .page import iframe_html, to_html

__all__ = [
    "Overlay",
    "OverlayError",
    "page_data",
    "tensor_stats",
    "to_html",
    "show",
    "iframe_html",
    "notebook_html",
    "mimebundle",
    "inline_svg",
]
