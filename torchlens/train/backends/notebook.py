"""A watch's explorer inline in Jupyter, live: the page updates as training goes on in the same
kernel, with no server and no port for the browser to reach.

Why a comm channel: the kernel may be remote (VS Code, JupyterHub, a tunnel) where no port of
its machine reaches the browser; the channel the notebook already has with its kernel always
does. The widget (``anywidget``, the optional extra ``torchlens[notebook]``) shows the explorer
page in a sandboxed iframe, as the static snapshot does, and a thread of the kernel reads the
run store (``Catalog``, as the page server does) and pushes what is new to it: new steps, their
histogram columns for every call, new calls with their layouts. Pushing rather than answering
the page's requests is what keeps it live while a cell runs: a kernel busy with a cell answers
no comm message before the cell ends, but it sends them from any thread.

After each cell, a step whose backward pass has ended is written (``flush``), so that the view
shows the steps of the cell that just ran (a watch otherwise writes a step when the next begins).

The output also carries the static snapshot as ``text/html`` (``notebook_html``): front ends
without widgets, nbconvert, and a notebook opened later without its kernel show that.
"""

from __future__ import annotations

import html
import sys
import threading
import time
import uuid
from typing import Any, Dict, Optional

from ...web.embed import packed_page, read_asset, srcdoc_frame
from ..serve import Catalog, page_data

PUSH_EVERY_S = 0.5  # how often the kernel looks for new steps (a few small queries)
_CLASS: Dict[str, Any] = {}


def in_kernel() -> bool:
    """Whether this code runs in a Jupyter kernel (an IPython shell with a kernel)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def live_available() -> bool:
    """Whether a live view can be shown here: in a Jupyter kernel, with ``anywidget`` installed."""
    if not in_kernel():
        return False
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return False
    return True


class LiveFeed:
    """What changed in the run at ``run_dir`` since it was last asked, as the messages the page's
    live.js applies. Not thread-safe by itself: ``LiveView`` calls it under a lock.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model, folder = torch.nn.Linear(2, 2), tempfile.mkdtemp()
        >>> w = tl.watch(model, run_dir=folder, backend=None, verbose=False)
        >>> feed = LiveFeed(folder)
        >>> feed.page_data()["summary"]["steps"], feed.update() is None
        ([], True)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> w.flush()  # the step is written (at the latest when the next one starts)
        >>> news = feed.update()
        >>> news["steps"], [s["steps"] for s in news["series"][""]["series"]][:1]  # the model's own series
        ([0], [[0]])
        >>> w.close(); feed.close()
    """

    def __init__(self, run_dir: str) -> None:
        self.catalog = Catalog(run_dir)
        self.last_step = -1
        self.stride = 1
        self.status = ""
        self.num_calls = 0

    def page_data(self) -> dict:
        """The page's data now (a snapshot), marked live; later updates start from it."""
        data = page_data(self.catalog, ".")
        summary = data["summary"]
        self.last_step = summary["steps"][-1] if summary["steps"] else -1
        self.stride, self.status, self.num_calls = summary["stride"], summary["status"], len(summary["calls"])
        return {**data, "live": True}

    def update(self, since: Optional[int] = None, again: bool = False) -> Optional[dict]:
        """What is new after step ``since`` (default: what this feed last reported), or None;
        ``again``: also the columns of step ``since`` itself (a step written again, e.g. when
        the optimizer step or the end of a cell completes it)."""
        since = self.last_step if since is None else since
        news = self.catalog.poll_json(".", since)
        fresh_calls = news["num_calls"] != self.num_calls
        restart = news["stride"] != self.stride
        if not (
            again or news["steps"] or fresh_calls or restart or news["status"] != self.status or since < self.last_step
        ):
            return None
        update: Dict[str, Any] = {"steps": news["steps"], "stride": news["stride"], "status": news["status"]}
        if restart:
            update["restart"] = True
        if fresh_calls or restart or since < self.last_step:
            data = page_data(self.catalog, ".")  # the calls, their layouts: only when calls appear
            update.update(summary=data["summary"], layouts=data["layouts"])
            series_ids = list(data["summary"]["series"])
        else:
            names = self.catalog.run(".").series_names() if news["steps"] or again else []
            series_ids = list(dict.fromkeys(cid for cid, _, _ in names))
        # the columns that gained steps: new ones, and the one still filling (stride > 1); with
        # ``again``, the last one sent too
        column_since = None if restart else (since if again else since + 1)
        update["series"] = {cid: self.catalog.call_series_json(".", cid, since=column_since) for cid in series_ids}
        if news["steps"]:
            self.last_step = max(self.last_step, news["steps"][-1])
        self.stride, self.status, self.num_calls = news["stride"], news["status"], news["num_calls"]
        return update

    def close(self) -> None:
        self.catalog.close()


def _widget_class() -> Any:
    """The anywidget class, made on first use (``import torchlens`` never imports anywidget)."""
    if "widget" not in _CLASS:
        import anywidget
        import traitlets

        class LiveExplorer(anywidget.AnyWidget):  # type: ignore[misc]
            _esm = read_asset("notebook_widget.js")
            page = traitlets.Unicode("").tag(sync=True)
            height = traitlets.Int(640).tag(sync=True)

        _CLASS["widget"] = LiveExplorer
    return _CLASS["widget"]


class LiveView:
    """A watch's live explorer: the widget, the thread that feeds it, and the after-cell flush.
    Made by ``live_view``; stops by itself once the run is finished and its last step sent."""

    def __init__(self, watch: Any, height: int = 640) -> None:
        self.watch = watch
        self.feed = LiveFeed(watch.run_dir)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.height = int(height)
        self.display_id = f"torchlens-live-{uuid.uuid4().hex}"
        data = self.feed.page_data()
        page = packed_page("index.html", data, "TORCHLENS_EXPORT", extra_scripts=["live.js"])
        self.static_html = srcdoc_frame(page, height)  # the fallback: the same page, left as it is
        self.widget = _widget_class()(page=page, height=int(height))
        self.widget.on_msg(self._on_message)
        self._shell = sys.modules["IPython"].get_ipython()
        self._shell.events.register("post_run_cell", self._after_cell)
        self._thread = threading.Thread(target=self._run, name="torchlens-live-view", daemon=True)
        self._thread.start()

    def _push(self, since: Optional[int] = None, again: bool = False) -> bool:
        """Send what is new; False once the run is over and nothing is left to send."""
        with self._lock:
            update = self.feed.update(since, again)
        if update is not None:
            self.widget.send({"type": "update", "update": update})
        return update is not None or self.feed.status == "running"

    def _run(self) -> None:
        finished = False
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                if not self._push():
                    finished = True
                    break
                # reading every call's new columns costs the training process: never more than a
                # fifth of its time however large the model
                self._stop.wait(max(PUSH_EVERY_S, 4 * (time.monotonic() - started)))
        except Exception as error:  # noqa: BLE001 - the kernel must not print a thread's traceback
            self.widget.send({"type": "error", "message": f"torchlens: the live view stopped: {error}"})
        finally:
            self._unregister()
            with self._lock:
                self.feed.close()
        if finished:
            self._settle()

    def _settle(self) -> None:
        """The run is over: the output becomes the final snapshot. A notebook saved with a widget
        whose kernel is gone shows an error in JupyterLab ("model not found"); a snapshot shows."""
        from IPython.display import update_display

        from ..serve import notebook_html

        final = {"text/html": notebook_html(self.watch.run_dir, self.height), "text/plain": repr(self.watch)}
        update_display(final, raw=True, display_id=self.display_id)
        self.widget.close()

    def _on_message(self, widget: Any, content: Any, buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "sync" and self._thread.is_alive():
            self._push(since=int(content.get("since", -1)))

    def _after_cell(self, result: Any = None) -> None:
        w = self.watch
        # the step a cell ran to its end (backward included) is complete: write it now, so the
        # view shows it; a step whose backward is still to come is left alone
        if not w.closed and not w.manual_steps and w.step_complete():
            w.flush()
            if self._thread.is_alive():  # the cell's last step may have been written before: send it again
                self._push(again=True)

    def _unregister(self) -> None:
        try:
            self._shell.events.unregister("post_run_cell", self._after_cell)
        except ValueError:  # already gone
            pass

    def stop(self) -> None:
        """Stop pushing (the view keeps what it shows)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def mimebundle(self) -> dict:
        """The widget's view, with the static snapshot and the watch's text beside it."""
        bundle = self.widget._repr_mimebundle_()
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        return {**data, "text/html": self.static_html, "text/plain": repr(self.watch)}

    def display(self) -> None:
        """Show the view as a display of its own (an id lets the end of the run replace it)."""
        from IPython.display import display

        display(self.mimebundle(), raw=True, display_id=self.display_id)


def mimebundle(watch: Any, height: int = 640) -> Dict[str, str]:
    """What Jupyter shows for ``watch``: the live view where one can run (a kernel with anywidget,
    a watch still open), else the static snapshot (``notebook_html``).

    The live view is displayed here, as a display of its own, and only the watch's text is
    returned: a cell's result cannot be replaced later (only a display with an id can), and the
    view is replaced by the final snapshot when the run ends, so that the saved notebook keeps it.
    """
    if live_available() and not watch.closed and watch.run_dir is not None:
        live_view(watch, height).display()
        text = repr(watch)  # as HTML too: else Jupyter would add the snapshot (_repr_html_) below the view
        return {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}
    from ..serve import notebook_html

    return {"text/html": notebook_html(watch.run_dir, height), "text/plain": repr(watch)}


def live_view(watch: Any, height: int = 640) -> LiveView:
    """A new live view of ``watch`` (each display is a view of its own; all of them are fed)."""
    view = LiveView(watch, height)
    views = watch.__dict__.setdefault("_live_views", [])
    views.append(view)
    return view


def show(watch: Any, height: int = 640) -> Any:
    """Display the explorer of ``watch`` in the running Jupyter kernel: live where it can be (see
    ``mimebundle``), else the static snapshot. Outside a kernel, raise ``RuntimeError``."""
    if not in_kernel():
        from ..serve import show_inline

        return show_inline(watch.run_dir, height)  # raises, naming the alternatives
    if live_available() and not watch.closed and watch.run_dir is not None:
        live_view(watch, height).display()
    else:
        from IPython.display import display

        display(mimebundle(watch, height), raw=True)
    return None  # returning the view would show it twice when show() ends a cell


__all__ = ["LiveFeed", "LiveView", "in_kernel", "live_available", "live_view", "mimebundle", "show"]
