"""The front-end assets shared by the explorer page and the op-level graph page (HTML, CSS and
JavaScript in ``assets/``, no third-party code), and ``inline_page``: one of them with every
asset inlined into a single self-contained HTML file (no server, no network), used by the
explorer's export and by ``ModelHistory.to_html``.

Example:
    >>> from torchlens.web.embed import inline_page
    >>> page = inline_page("index.html", {"x": 1}, "TORCHLENS_EXPORT")
    >>> "window.TORCHLENS_EXPORT" in page and 'src="/assets/' not in page and 'href="/assets/' not in page
    True
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")

_CSS = re.compile(r'<link rel="stylesheet" href="/assets/([\w.-]+\.css)">')
_JS = re.compile(r'<script src="/assets/([\w.-]+\.js)"></script>')


def read_asset(name: str) -> str:
    """The text of ``torchlens/web/assets/<name>``."""
    with open(os.path.join(ASSETS_DIR, name), encoding="utf-8") as f:
        return f.read()


def inline_script(text: str) -> str:
    """``text`` made safe inside a <script> element (nothing in it may close the element)."""
    return text.replace("</", "<\\/")


def inline_page(template: str, data: Any, global_name: str) -> str:
    """The asset page ``template`` with every ``/assets/`` stylesheet and script inlined, and
    ``data`` given to the page before its first script as ``window.<global_name>``."""
    page = read_asset(template)
    page = _CSS.sub(lambda m: f"<style>\n{read_asset(m.group(1))}</style>", page)
    blob = inline_script(json.dumps(data, separators=(",", ":")))
    first = [True]

    def script(m: "re.Match[str]") -> str:
        text = f"<script>\n{inline_script(read_asset(m.group(1)))}</script>"
        if first[0]:
            first[0] = False
            text = f"<script>window.{global_name} = {blob};</script>\n" + text
        return text

    return _JS.sub(script, page)


__all__ = ["ASSETS_DIR", "read_asset", "inline_script", "inline_page"]
