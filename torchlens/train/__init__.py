"""The train wing: ``watch`` records histograms of a model while it trains (module hooks, the run
database, wandb and TensorBoard), ``open_run`` reads them, ``serve`` shows them on a page.

Its folders, by job:

- ``step/``: ``tl.watch`` itself, its options, a step's life (its states and their one
  transition table), the step's clock (``timeline``) and its writer thread;
- ``model/``: what the watch sees of the model: the module-call graph, compiled and wrapped models;
- ``record/``: the hooks of a logged step: samples, the per-tensor parts of a step's data,
  the ``updates`` kind, the saturation counts;
- ``measure/``: the numbers: exact statistics of many tensors (batched, deferred), the batched
  GPU measuring, the global batch under ``torch.distributed``;
- ``health/``: ``run.health()`` and the NaN sentinel that checks (and replays) every step;
- ``store/``: the run database (written by ``database``, read by ``reader``), its exports,
  ``torchlens runs`` (``query``) and the comparison of two runs;
- ``serve/``: the explorer page's server and its self-contained export;
- ``backends/``: where histograms go besides the run: wandb, TensorBoard, the notebook;
- ``callbacks/``: ``TorchlensCallback`` for Lightning and the Hugging Face ``Trainer``.
"""

from .health import DivergenceWarning, NonfiniteError, NonfiniteWarning
from .limits import setup
from .measure import RankMismatchError
from .serve import Catalog, NotFound, PortInUseError, explore, export_html
from .step import Watch, WatchOptions, attach, unwatch, watch
from .store import Run, RunError, Series, open_run, runs_main

__all__ = [
    "watch",
    "unwatch",
    "attach",
    "setup",
    "open_run",
    "Run",
    "RunError",
    "Series",
    "Watch",
    "WatchOptions",
    "NonfiniteError",
    "NonfiniteWarning",
    "DivergenceWarning",
    "RankMismatchError",
    "explore",
    "export_html",
    "Catalog",
    "NotFound",
    "PortInUseError",
    "runs_main",
]
