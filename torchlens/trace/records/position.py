"""Where a tensor sat in a call's arguments or outputs, and what a random operation's replay needs.

A position is an ``int`` (positional argument), a ``str`` (keyword argument), or a tuple path
into nested lists/tuples/dicts/objects, e.g. ``(1, 0)`` for ``args[1][0]`` or ``('hx', 1)``
(``capture/args.py`` finds them; ``TensorLogEntry.output_index`` and ``parent_refs`` keep them).

Example:
    >>> position: Position = ("hx", 1)
    >>> position[0]
    'hx'
"""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch

Position = Union[int, str, Tuple[Union[int, str], ...]]

# The generator states before a random operation: torch's CPU state and, once CUDA is
# initialised, every CUDA device's state (``TensorLogEntry.rng_state``, replayed by trace/replay.py).
OpRngState = Tuple[torch.Tensor, Optional[List[torch.Tensor]]]

__all__ = ["OpRngState", "Position"]
