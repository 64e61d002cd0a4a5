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

import base64
import gzip
import html
import json
import os
import re
from typing import Any, Sequence

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


# Runs first in a packed page: waits until the page is on screen (a notebook of ten graphs lays
# out only those scrolled to), unpacks the gzip bundle with the browser's own DecompressionStream,
# gives the data to the page as window.<name>, then runs the page's scripts in order.
_UNPACK = """(function () {
  "use strict";
  var started = false;
  function fail(message) {
    var box = document.createElement("pre");
    box.setAttribute("data-role", "unpack-error");
    box.style.cssText = "color:#b00;padding:1em;white-space:pre-wrap";
    box.textContent = message;
    document.body.appendChild(box);
  }
  function unpack() {
    if (started) return;
    started = true;
    var text = document.getElementById("tl-packed").textContent.trim();
    var bytes = Uint8Array.from(atob(text), function (c) { return c.charCodeAt(0); });
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    new Response(stream).text().then(function (json) {
      var bundle = JSON.parse(json);
      window[bundle.name] = bundle.data;
      bundle.scripts.forEach(function (code) {
        var script = document.createElement("script");
        script.textContent = code;
        document.body.appendChild(script);
      });
    }).catch(function (error) { fail("torchlens: the page could not be unpacked: " + error); });
  }
  if (typeof DecompressionStream === "undefined") {
    fail("torchlens: this browser cannot unpack the page (it needs DecompressionStream: Chrome 80+, Firefox 113+, Safari 16.4+). Write the page to a file with to_html(path) and open it in a newer browser.");
  } else if (typeof IntersectionObserver === "undefined") {
    unpack();
  } else {
    var seen = new IntersectionObserver(function (entries) {
      if (entries.some(function (e) { return e.isIntersecting; })) { seen.disconnect(); unpack(); }
    });
    seen.observe(document.documentElement);
  }
})();"""


def packed_page(template: str, data: Any, global_name: str, extra_scripts: Sequence[str] = ()) -> str:
    """Like ``inline_page``, for pages embedded many times (notebook outputs): the data and the
    scripts travel as one gzip+base64 bundle (a GPT-2 graph: 630 KB of JSON in 110 KB), unpacked
    in the browser only once the page is on screen, so hidden pages cost no layout.
    ``extra_scripts``: more assets to run before the page's last script (e.g. ``live.js``).

    Example:
        >>> from torchlens.web.embed import packed_page
        >>> page = packed_page("index.html", {"x": 1}, "TORCHLENS_EXPORT")
        >>> 'id="tl-packed"' in page and "DecompressionStream" in page and 'src="/assets/' not in page
        True
    """
    page = read_asset(template)
    page = _CSS.sub(lambda m: f"<style>\n{read_asset(m.group(1))}</style>", page)
    names = _JS.findall(page)
    scripts = [read_asset(name) for name in names[:-1] + list(extra_scripts) + names[-1:]]
    bundle = json.dumps({"name": global_name, "data": data, "scripts": scripts}, separators=(",", ":"))
    packed = base64.b64encode(gzip.compress(bundle.encode("utf-8"), compresslevel=6, mtime=0)).decode("ascii")
    first = [True]

    def script(m: "re.Match[str]") -> str:
        if not first[0]:
            return ""
        first[0] = False
        return (
            f'<script type="application/octet-stream" id="tl-packed">{packed}</script>\n'
            f"<script>\n{inline_script(_UNPACK)}\n</script>"
        )

    return _JS.sub(script, page)


def srcdoc_frame(page: str, height: int = 640) -> str:
    """``page`` in an ``<iframe srcdoc>`` as wide as the notebook cell and ``height`` pixels tall:
    sandboxed (its scripts run, isolated from the notebook's page, styles and ids) and lazy.

    Example:
        >>> srcdoc_frame("<p>a & b</p>", height=100)[:80]
        '<iframe srcdoc="&lt;p&gt;a &amp; b&lt;/p&gt;" style="width: 100%; height: 100px;'
    """
    if int(height) < 100:
        raise ValueError(f"height={height!r} is too small to show the page; give at least 100 (pixels).")
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: {int(height)}px; '
        f'border: 1px solid #ddd; border-radius: 4px;" sandbox="allow-scripts" loading="lazy"></iframe>'
    )


__all__ = ["ASSETS_DIR", "read_asset", "inline_script", "inline_page", "packed_page", "srcdoc_frame"]
