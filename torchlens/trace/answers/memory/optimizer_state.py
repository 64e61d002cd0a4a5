"""The optimizer state a training step holds, for ``memory_report``: from a name (``'adam'``),
from the optimizer object the user holds (its ``state`` once it has stepped, else its class and
hyperparameters), or from an optimizer class.

Per-parameter state tensors of ``torch.optim`` (the shape of the parameter, its dtype; 0-d
``step`` counters are left out): ``PER_PARAMETER``. A name counts float32 state, as in
mixed-precision training; an object or a class counts the parameters' own dtype, as
``torch.optim`` keeps it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Sequence, Tuple, Union

import torch

from ....arguments import ArgumentValueError

# state tensors per parameter (each of the parameter's shape), from a param group's options
PER_PARAMETER: Dict[str, Callable[[Dict[str, Any]], int]] = {
    "SGD": lambda g: 1 if g.get("momentum", 0) else 0,
    "Adam": lambda g: 3 if g.get("amsgrad") else 2,
    "AdamW": lambda g: 3 if g.get("amsgrad") else 2,
    "Adamax": lambda g: 2,
    "NAdam": lambda g: 2,
    "RAdam": lambda g: 2,
    "Adadelta": lambda g: 2,
    "Rprop": lambda g: 2,
    "Adagrad": lambda g: 1,
    "RMSprop": lambda g: 1 + bool(g.get("momentum", 0)) + bool(g.get("centered")),
    "ASGD": lambda g: 1,
    "SparseAdam": lambda g: 2,
}
# a name: float32 state tensors per trainable element ('sgd' with momentum)
NAMES = {"none": 0, "sgd": 1, "adam": 2, "adamw": 2}
_FP32 = 4

Optimizer = Union[None, str, torch.optim.Optimizer, type]


def optimizer_state(optimizer: Optimizer, trainable: Sequence[torch.Tensor]) -> Tuple[str, int]:
    """``(what it is, bytes)`` of the state ``optimizer`` keeps for ``trainable`` parameters.

    Example:
        >>> import torch
        >>> w = torch.nn.Parameter(torch.zeros(10, 10))
        >>> optimizer_state("adam", [w]), optimizer_state(torch.optim.SGD([w], lr=0.1, momentum=0.9), [w])
        (('adam', 800), ('SGD', 400))
    """
    if optimizer is None or isinstance(optimizer, str):
        key = "none" if optimizer is None else optimizer.lower()
        if key not in NAMES:
            raise _unknown(repr(optimizer))
        return key, NAMES[key] * _FP32 * sum(p.numel() for p in trainable)
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer).__name__, _of_object(optimizer, trainable)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        count = _per_parameter(optimizer, {})
        return optimizer.__name__, count * sum(_nbytes(p) for p in trainable)
    raise _unknown(f"a {type(optimizer).__name__}")


def _of_object(optimizer: torch.optim.Optimizer, trainable: Sequence[torch.Tensor]) -> int:
    """Its own state where it has some (after a step: exact), else its class and options."""
    ours = {id(p) for p in trainable}
    total = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in ours:  # a parameter of another model: not this step's memory
                continue
            state = optimizer.state.get(p)
            if state:
                total += sum(_nbytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
            else:
                total += _per_parameter(type(optimizer), group) * _nbytes(p)
    return total


def _per_parameter(cls: type, group: Dict[str, Any]) -> int:
    rule = PER_PARAMETER.get(cls.__name__)
    if rule is None:
        raise ArgumentValueError(
            f"memory_report: torchlens does not know what state {cls.__name__} keeps per parameter, and this "
            "optimizer has none yet. Pass the optimizer object after one optimizer.step() (its state is then "
            "measured), or leave optimizer=None and add k x mem.grads to mem.peak_estimate yourself "
            "(k: the state tensors it keeps per parameter, in the parameters' dtype)."
        )
    return rule(group)


def _unknown(what: str) -> ValueError:
    return ArgumentValueError(
        f"memory_report: optimizer must be None, 'sgd' (with momentum), 'adam', 'adamw', a torch.optim optimizer "
        f"object or class (e.g. optimizer=torch.optim.Adam(model.parameters())), not {what}. For another "
        "optimizer, leave optimizer=None and add k x mem.grads to mem.peak_estimate (k: the state tensors it "
        "keeps per parameter, in the parameters' dtype; 2 for Adam-like ones)."
    )


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


__all__ = ["optimizer_state", "PER_PARAMETER", "NAMES"]
