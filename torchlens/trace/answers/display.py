"""An answer inside a notebook: its story as text, then the graph page of its history opened
where the answer points, packed into an isolated ``<iframe>`` exactly as a history shows itself
(``ModelHistory._repr_html_``: compressed data, no server, no network).

Example:
    >>> import torch, torchlens as tl
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    >>> html_text = answer_html("the story", h, focus="linear_1_1")
    >>> html_text.startswith("<pre>the story</pre><iframe srcdoc=")
    True
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Optional

from ..history.extensions import extension

if TYPE_CHECKING:
    from ..history.model_history import ModelHistory

HEIGHT = 600


def answer_html(story: str, history: Optional["ModelHistory"], overlay: Any = None, focus: Optional[str] = None) -> str:
    """``story`` as preformatted text, then (with a ``history``) its graph page ``HEIGHT`` pixels
    high, coloured by ``overlay`` and opened on ``focus``."""
    text = f"<pre>{html.escape(story)}</pre>"
    if history is None:
        return text
    return text + extension("notebook_html")(history, HEIGHT, overlay=overlay, focus=focus)


__all__ = ["answer_html", "HEIGHT"]
