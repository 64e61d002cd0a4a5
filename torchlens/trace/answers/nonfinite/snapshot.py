"""What ``find_nonfinite`` puts back: the model's buffers, and the parameters a pass writes into."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ...capture import BufferSnapshot, PassHook, storage_key


class ModelSnapshot(PassHook):
    """Buffers (copied, as every pass does), and parameters copied only when a logged call is
    about to write into one (or a view of one) during a pass: ``before_write``, as a pass hook. Copying every parameter up front cost 10-20 % of a forward + backward, and a model
    rarely writes its own."""

    def __init__(self, model: nn.Module) -> None:
        self.buffers = BufferSnapshot(model)
        params = [(a, p) for a, p in model.named_parameters() if not is_lazy(p)]
        self.versions = [(a, p, p._version) for a, p in params]
        self.by_storage = {storage_key(p): p for _, p in params}
        self.by_storage.pop(None, None)  # no memory to share (meta, sparse...)
        self.copies: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def before_write(self, tensor: torch.Tensor) -> None:
        key = storage_key(tensor)
        param = self.by_storage.get(key) if key is not None else None
        if param is not None and id(param) not in self.copies:
            self.copies[id(param)] = (param, param.detach().clone())

    def restore_buffers(self) -> None:
        self.buffers.restore()

    def restore(self) -> List[str]:
        """Put everything back; returns the addresses of parameters written by something
        torchlens does not see (``.data``, a C extension), which could not be put back."""
        self.buffers.restore()
        with torch.no_grad():
            for param, value in self.copies.values():
                param.copy_(value)
        return [a for a, p, version in self.versions if id(p) not in self.copies and p._version != version]


__all__ = ["ModelSnapshot"]
