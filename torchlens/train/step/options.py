"""``tl.watch``'s arguments, checked before anything is made, written or served: a port of
``True`` (which Python counts as 1) or ``log="io2"`` is refused with an error naming the argument,
what it got and what it takes (the rules: ``torchlens/arguments.py``).

Example:
    >>> import torch, torchlens as tl
    >>> tl.watch(torch.nn.Linear(2, 2), port=True)
    Traceback (most recent call last):
    ...
    torchlens.arguments.ArgumentTypeError: tl.watch: port takes an int in 0..65535, not True (bool).
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn

from ...arguments import (
    check_arguments,
    refuse_type,
    require_choice,
    require_float,
    require_instance,
    require_int,
    require_path,
    require_str,
)
from ..health import MODES

CALLER = "tl.watch"
INT64 = 2**63 - 1  # counts are stored in the run database as 64-bit integers


def check_watch_arguments(arguments: Dict[str, Any]) -> None:
    """Check ``tl.watch``'s arguments (its ``locals()``); ``log`` and ``backend`` are checked
    where they are read."""
    a = arguments
    require_instance("model", a["model"], CALLER, nn.Module, takes="a torch.nn.Module")
    check_arguments(CALLER, a)  # the flags: disable_inplace, verbose, manual_steps, ...
    require_int("log_freq", a["log_freq"], CALLER, minimum=1, maximum=INT64)
    require_int("port", a["port"], CALLER, minimum=0, maximum=65535)
    require_str("host", a["host"], CALLER)
    require_int("sample_n", a["sample_n"], CALLER, minimum=1, maximum=INT64, optional=True)
    require_float("reject_outlier_proportion", a["reject_outlier_proportion"], CALLER, minimum=0.0, below=1.0)
    require_int("max_columns", a["max_columns"], CALLER, minimum=2, maximum=INT64)
    require_int("wandb_html_every", a["wandb_html_every"], CALLER, minimum=1, maximum=INT64)
    require_choice("on_nonfinite", a["on_nonfinite"], CALLER, (None, *MODES))
    if a["run_dir"] is not None:
        require_path("run_dir", a["run_dir"], CALLER, new=True)
    classes = a["ignore_io_grad_classes"]
    if not isinstance(classes, (list, tuple, set, frozenset)) or not all(isinstance(c, type) for c in classes):
        raise refuse_type(CALLER, "ignore_io_grad_classes", classes, "a list of module classes")
    optimizer = a["optimizer"]
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    if optimizer is not None and not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise refuse_type(CALLER, "optimizer", optimizer, "a torch.optim.Optimizer, a list of them, or None")


__all__ = ["check_watch_arguments"]
