"""Gradients of saved layers (``log_forward_pass(save_gradients=True)``)."""

from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch.utils.hooks import RemovableHandle

from ..records.tensor_log import TensorLogEntry


def record_gradient(tensor: torch.Tensor, e: TensorLogEntry) -> None:
    """Hook ``tensor`` so the gradient reaching it in backward is stored on ``e`` (summed if
    backward runs again).

    The hook holds ``e`` only weakly: the hook lives in the autograd graph, and ``e`` holds a
    saved activation that points back into the same graph; a strong reference would make a
    cycle through C++ autograd nodes that Python's gc cannot see, leaking every history. Once
    the history (and so ``e``) is gone, the hook is removed, so tensors that outlive the pass
    (inputs, parameters) do not collect dead hooks trace after trace.
    """
    handle: Optional[RemovableHandle] = None

    def forget(_ref: weakref.ref[TensorLogEntry]) -> None:
        if handle is not None:
            handle.remove()

    entry_ref = weakref.ref(e, forget)

    def record(grad: torch.Tensor) -> None:
        entry = entry_ref()
        if entry is None:
            return
        grad = grad.detach()
        entry.gradient = grad.clone() if entry.gradient is None else entry.gradient + grad

    # pickling the tensor (a pickled history) leaves this hook behind, as it should: no warning
    handle = tensor.register_hook(torch.utils.hooks.unserializable_hook(record))


__all__ = ["record_gradient"]
