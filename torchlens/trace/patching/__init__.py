"""Activation patching across runs: ``tl.patch`` (one patched pass) and ``tl.patch_sweep`` (the
grid of layers x positions), re-running only what is downstream of each patch from one trace."""

from .grid import PatchGrid
from .patch import PatchResult, patch
from .select import PatchError, Selection
from .sweep import patch_sweep

__all__ = ["patch", "patch_sweep", "PatchResult", "PatchGrid", "PatchError", "Selection"]
