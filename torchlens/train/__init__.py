"""Training-time explorer: ``watch`` records histograms while a model trains; ``open_run`` reads them."""

from .reader import Run, RunError, Series, open_run
from .session import Watch, attach, setup, unwatch, watch

__all__ = ["watch", "unwatch", "attach", "setup", "open_run", "Run", "RunError", "Series", "Watch"]
