"""Where a watch's histograms go besides the run database: Weights & Biases and TensorBoard.

Each backend receives every logged step's histograms (and, for wandb, the explorer page as one
self-contained HTML file every few logged steps). Their packages are optional and imported only
when asked for.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, List, Optional, Tuple

import numpy as np

from ...web.stats import Histograms

Key = Tuple[str, str, str]


def tag(key: Key) -> str:
    """``torchlens/<call id>/<kind>/<name>``; the model itself is ``model``."""
    call_id, kind, name = key
    return f"torchlens/{call_id or 'model'}/{kind}/{name}"


def _require(package: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        raise ImportError(
            f"tl.watch(backend='{extra}') needs the '{package}' package: "
            f"pip install 'torchlens[{extra}]' (or pip install {package})."
        ) from None


class WandbBackend:
    """Logs into the active wandb run: each series as a ``wandb.Histogram`` against the custom
    x-axis ``torchlens/step`` (the training step), and the explorer page as ``torchlens/explorer``
    (``wandb.Html``).

    The user's own ``wandb.log`` steps are left alone: every torchlens row is logged with
    ``commit=False``, so it joins the user's next ``wandb.log`` row instead of taking a step of its
    own. Only while the user has logged nothing since the watch began does torchlens commit its
    pending row itself (else each logged step would overwrite the last). If the user logs less
    often than torchlens, wandb keeps the histograms of the last torchlens step before each of
    the user's rows; the run database keeps every step.
    """

    name = "wandb"

    def __init__(self, html_every: int = 50) -> None:
        self.wandb = _require("wandb", "wandb")
        if self.wandb.run is None:
            raise RuntimeError(
                "tl.watch(backend='wandb') logs into the active wandb run, and there is none: "
                "call wandb.init() first (and tl.setup() before it for long runs)."
            )
        self.run = self.wandb.run
        self.html_every = html_every
        self.logged = 0
        self.run.define_metric("torchlens/step")
        self.run.define_metric("torchlens/*", step_metric="torchlens/step")
        self.start_step = self._wandb_step()
        self.pending_at: Optional[int] = None  # the wandb step our uncommitted row waits on
        self.own_rows = 0  # rows torchlens committed itself (while the user logged nothing)

    def _wandb_step(self) -> Optional[int]:
        try:
            return int(self.run.step)
        except Exception:  # e.g. wandb's "shared" mode has no step to read
            return None

    def _log(self, data: dict) -> None:
        now = self._wandb_step()
        if self.pending_at is not None and now is not None and now == self.pending_at:
            user_logged = self.start_step is None or now - self.start_step > self.own_rows
            if not user_logged:  # nobody else commits rows: commit ours before the next one
                self.run.log({}, commit=True)
                self.own_rows += 1
                now += 1
        self.run.log(data, commit=False)
        self.pending_at = now

    def log_step(self, step: int, keys: List[Key], h: Histograms, run_dir: str) -> None:
        data = {"torchlens/step": step}
        for i, key in enumerate(keys):
            if not np.isfinite(h.lo[i]):
                continue
            data[tag(key)] = self.wandb.Histogram(np_histogram=(h.counts[i].astype(np.float64), h.edges(i)))
        self.logged += 1
        if self.logged == 1 or self.logged % self.html_every == 0:
            data["torchlens/explorer"] = self._page(run_dir)
        self._log(data)

    def _page(self, run_dir: str) -> Any:
        from ..serve import export_html

        with tempfile.TemporaryDirectory() as folder:
            path = export_html(run_dir, os.path.join(folder, "explorer.html"))
            with open(path, encoding="utf-8") as f:
                return self.wandb.Html(f.read(), inject=False)

    def close(self, run_dir: str) -> None:
        if self.logged and self.logged % self.html_every != 0 and self.run is self.wandb.run:
            self._log({"torchlens/explorer": self._page(run_dir)})  # the final state of the run


class TensorboardBackend:
    """``add_histogram_raw`` for each series, with the same tags, into ``run_dir`` or the
    ``SummaryWriter`` passed as ``tensorboard_writer``; the module-call graph once, at the first
    logged step, for TensorBoard's Graphs tab (see ``tensorboard_graph``)."""

    name = "tensorboard"

    def __init__(self, run_dir: str, writer: Optional[Any] = None) -> None:
        if writer is None:
            _require("tensorboard", "tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=run_dir)
            self.owns_writer = True
        else:
            self.owns_writer = False
        self.writer = writer
        self.graph_written = False

    def _write_graph(self, run_dir: str) -> None:
        from tensorboard.compat.proto import event_pb2

        from ..store import open_run
        from .tensorboard_graph import graph_def

        with open_run(run_dir) as run:
            graph = graph_def(run.calls)
        # SummaryWriter.add_graph only takes a model to trace with TorchScript; the event it
        # writes is this one
        self.writer._get_file_writer().add_event(event_pb2.Event(graph_def=graph.SerializeToString()))
        self.graph_written = True

    def log_step(self, step: int, keys: List[Key], h: Histograms, run_dir: str) -> None:
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

        if not self.graph_written:
            self._write_graph(run_dir)
        values = []
        for i, key in enumerate(keys):
            if not np.isfinite(h.lo[i]):
                continue
            edges = h.edges(i)
            histogram = HistogramProto(
                min=float(h.lo[i]),
                max=float(h.hi[i]),
                num=float(h.counts[i].sum()),
                sum=float(h.sums[i]),
                sum_squares=float(h.sums_of_squares[i]),
                bucket_limit=edges[1:].tolist(),
                bucket=h.counts[i].tolist(),
            )
            values.append(Summary.Value(tag=tag(key), histo=histogram))
        # one event holding every series of the step (what add_histogram_raw writes, once per
        # series, at several times the cost)
        self.writer._get_file_writer().add_summary(Summary(value=values), global_step=step)
        self.writer.flush()

    def close(self, run_dir: str) -> None:
        if self.owns_writer:
            self.writer.close()
        else:
            self.writer.flush()


__all__ = ["WandbBackend", "TensorboardBackend", "tag"]
