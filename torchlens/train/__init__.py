"""The train wing: ``watch`` records histograms of a model while it trains (module hooks, the run
database, wandb and TensorBoard), ``open_run`` reads them, ``serve`` shows them on a page."""

from .limits import setup
from .reader import Run, RunError, Series, open_run
from .sentinel import DivergenceWarning, NonfiniteError, NonfiniteWarning
from .session import Watch, attach, unwatch, watch

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
    "NonfiniteError",
    "NonfiniteWarning",
    "DivergenceWarning",
]
