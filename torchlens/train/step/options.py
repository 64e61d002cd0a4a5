"""``tl.watch``'s options as one value (``WatchOptions``), checked once, before anything is made,
written or served: a port of ``True`` (which Python counts as 1) or ``log="io2"`` is refused with
an error naming the option, what it got and what it takes (the rules: ``torchlens/arguments.py``).
The checked value holds the options normalised (``log`` and ``backend`` as tuples of names, the
optimizers as a tuple).

Example:
    >>> import torch, torchlens as tl
    >>> tl.watch(torch.nn.Linear(2, 2), port=True)
    Traceback (most recent call last):
    ...
    torchlens.arguments.ArgumentTypeError: tl.watch: port takes an int in 0..65535, not True (bool).
    >>> WatchOptions(log="io", backend=None).log, WatchOptions(backend="wandb").backend
    (('io',), ('wandb',))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch

from ...arguments import (
    check_arguments,
    refuse_type,
    require_choice,
    require_choices,
    require_float,
    require_int,
    require_path,
    require_str,
)
from ..health import MODES, check_mode
from ..store import KINDS

CALLER = "tl.watch"
INT64 = 2**63 - 1  # counts are stored in the run database as 64-bit integers
BACKENDS = ("standalone", "wandb", "tensorboard")
DEFAULT_KINDS = ("io", "io_grad", "params", "params_grad")


@dataclass(frozen=True)
class WatchOptions:
    """Every option of ``tl.watch`` but the model (their meaning: ``tl.watch``'s docstring),
    checked and normalised when the value is made."""

    log_freq: int = 1
    log: Iterable[str] = DEFAULT_KINDS
    backend: Union[str, Iterable[str], None] = "standalone"
    run_dir: Optional[str] = None
    port: int = 8080
    sample_n: Optional[int] = 100
    reject_outlier_proportion: float = 0.1
    disable_inplace: bool = False
    ignore_io_grad_classes: Iterable[type] = ()
    delay_log_multibackward: bool = False
    host: str = "127.0.0.1"
    max_columns: int = 512
    verbose: bool = True
    tensorboard_writer: Any = None
    wandb_html_every: int = 50
    manual_steps: bool = False
    input_grads: bool = False
    on_nonfinite: Optional[str] = None
    optimizer: Any = None
    durable: bool = True

    def __post_init__(self) -> None:
        self._check()
        normal: Dict[str, Any] = {
            "log": tuple(require_choices("log", self.log, CALLER, KINDS)),
            "backend": _backends(self.backend),
            "ignore_io_grad_classes": tuple(self.ignore_io_grad_classes),
            "reject_outlier_proportion": float(self.reject_outlier_proportion),
            "input_grads": bool(self.input_grads),
            "durable": bool(self.durable),
            "optimizer": _optimizers(self.optimizer),
        }
        check_mode(self.on_nonfinite)
        for name, value in normal.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    @property
    def kinds(self) -> Tuple[str, ...]:
        """The kinds of series logged (``log``, normalised)."""
        return tuple(self.log)

    @property
    def backends(self) -> Tuple[str, ...]:
        """The backends by name (``backend``, normalised; () writes only the run database)."""
        return tuple(self.backend or ())

    @property
    def optimizers(self) -> Tuple[torch.optim.Optimizer, ...]:
        """The optimizers given (``optimizer``, normalised; () when none was)."""
        return tuple(self.optimizer or ())

    def stored(self) -> Dict[str, Any]:
        """The options the run database keeps (its ``options`` meta entry)."""
        return {
            "log_freq": self.log_freq,
            "log": list(self.kinds),
            "sample_n": self.sample_n,
            "reject_outlier_proportion": self.reject_outlier_proportion,
            "disable_inplace": self.disable_inplace,
            "delay_log_multibackward": self.delay_log_multibackward,
            "input_grads": self.input_grads,
            "durable": self.durable,
        }

    def _check(self) -> None:
        """Each option's type and range, in the order of ``tl.watch``'s parameters."""
        a = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
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


def _backends(backend: Union[str, Iterable[str], None]) -> Tuple[str, ...]:
    if backend is None or backend == () or backend == []:
        return ()
    return tuple(require_choices("backend", backend, CALLER, BACKENDS))


def _optimizers(optimizer: Any) -> Optional[Tuple[torch.optim.Optimizer, ...]]:
    """None, or the optimizers given (one or a list) as a tuple."""
    if optimizer is None:
        return None
    return (optimizer,) if isinstance(optimizer, torch.optim.Optimizer) else tuple(optimizer)


__all__ = ["WatchOptions", "BACKENDS", "DEFAULT_KINDS"]
