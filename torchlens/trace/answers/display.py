"""The graph page of an answer inside a notebook: an ``<iframe>`` whose ``srcdoc`` holds the
whole page (its scripts and ids isolated from the notebook and from other answers).

Example:
    >>> page_iframe("<p>a & b</p>", "the story")[:52]
    '<pre>the story</pre><iframe srcdoc="&lt;p&gt;a &amp;'
"""

from __future__ import annotations

import html
from typing import Optional

HEIGHT = 600


def page_iframe(page: Optional[str], story: str, height: int = HEIGHT) -> str:
    """``story`` as preformatted text, then ``page`` (if any) in an iframe ``height`` pixels high."""
    if page is None:
        return f"<pre>{html.escape(story)}</pre>"
    return (
        f"<pre>{html.escape(story)}</pre>"
        f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: {int(height)}px; '
        'border: 1px solid #ddd; border-radius: 4px;" sandbox="allow-scripts" loading="lazy"></iframe>'
    )


__all__ = ["page_iframe", "HEIGHT"]
