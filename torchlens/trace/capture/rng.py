"""The random number generators a pass seeds and then puts back as the caller had them."""

from __future__ import annotations

import random
from typing import Any, List, Optional, Union

import numpy as np
import torch


class RngState:
    """The states of Python's, NumPy's, torch's and (once initialised) CUDA's generators.

    Taken when made (or by ``capture()``), put back by ``restore()``: a pass seeds the
    generators for itself and restores the caller's afterwards.

    Example:
        >>> state = RngState()
        >>> a = torch.rand(1)
        >>> state.restore()
        >>> bool(torch.rand(1) == a)
        True
    """

    def __init__(self) -> None:
        self.python: Any = None
        self.numpy: Any = None
        self.torch: torch.Tensor = torch.empty(0)
        self.cuda: Optional[List[torch.Tensor]] = None
        self.capture()

    def capture(self) -> None:
        """Take the generators' states as they are now."""
        self.python = random.getstate()
        self.numpy = np.random.get_state()
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        """Put the generators back in the states taken."""
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def seed_everything(seed: Union[int, RngState]) -> None:
    """Seed Python, NumPy, torch (and CUDA when in use) with ``seed``, or put them in the states
    an ``RngState`` holds (``tl.watch``'s sentinel replays a step from the states it began with).

    Example:
        >>> seed_everything(0); a = torch.rand(1)
        >>> seed_everything(0); bool(torch.rand(1) == a)
        True
    """
    if isinstance(seed, RngState):
        seed.restore()
        return
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # torch.manual_seed would also queue a lazy CUDA seeding that captures a stack trace on
    # every call; seed the CPU generator directly and CUDA only when it is in use.
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


__all__ = ["RngState", "seed_everything"]
