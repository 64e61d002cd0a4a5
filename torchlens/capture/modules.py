"""What the model is made of (module, parameter and buffer addresses), and a snapshot of the
state that tracing must leave exactly as it found it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch
from torch import nn


@dataclass
class ModelInventory:
    """Addresses of the model's modules, parameters and buffers, keyed by object id."""

    module_addresses: Dict[int, str]
    module_types: Dict[str, str]
    module_children: Dict[str, List[str]]
    param_addresses: Dict[int, str]
    param_info: Dict[str, Tuple[torch.Size, int, int]]  # address -> (shape, numel, nbytes)
    buffer_addresses: Dict[int, str]
    weighted_modules: frozenset = frozenset()  # addresses of modules holding parameters (at any depth)

    @classmethod
    def of(cls, model: nn.Module) -> "ModelInventory":
        module_addresses: Dict[int, str] = {}
        module_types: Dict[str, str] = {}
        children: Dict[str, List[str]] = {"": []}
        for address, module in model.named_modules():
            module_addresses.setdefault(id(module), address)
            module_types[address] = type(module).__name__
            if address:
                parent = address.rpartition(".")[0]
                children.setdefault(parent, []).append(address)
                children.setdefault(address, [])
        params: Dict[int, str] = {}
        info: Dict[str, Tuple[torch.Size, int, int]] = {}
        for address, p in model.named_parameters():
            params[id(p)] = address
            info[address] = (p.shape, p.numel(), p.numel() * p.element_size())
        buffers = {id(b): address for address, b in model.named_buffers()}
        weighted = {address.rsplit(".", i)[0] for address in info for i in range(1, address.count(".") + 1)}
        return cls(module_addresses, module_types, children, params, info, buffers, frozenset(weighted))


@dataclass
class ModelState:
    """Flags and attributes of a model that a pass must not change (restored on exit)."""

    training: List[Tuple[nn.Module, bool]] = field(default_factory=list)
    requires_grad: List[Tuple[torch.Tensor, bool]] = field(default_factory=list)

    @classmethod
    def of(cls, model: nn.Module) -> "ModelState":
        state = cls()
        for m in model.modules():
            state.training.append((m, m.training))
        for p in model.parameters():
            state.requires_grad.append((p, p.requires_grad))
        return state

    def restore(self) -> None:
        for m, training in self.training:
            if m.training != training:
                m.training = training
        for p, flag in self.requires_grad:
            if p.requires_grad != flag:
                p.requires_grad_(flag)


class BufferSnapshot:
    """The model's buffers (objects and values), to undo a metadata-only pass before the pass
    that saves: a stateful model (BatchNorm statistics, counters) then runs only once in effect."""

    def __init__(self, model: nn.Module) -> None:
        self.dicts = [(m, dict(m._buffers)) for m in model.modules()]
        self.values = [(b, b.detach().clone()) for _, bs in self.dicts for b in bs.values() if b is not None]

    def restore(self) -> None:
        for module, buffers in self.dicts:
            module._buffers.clear()
            module._buffers.update(buffers)
        with torch.no_grad():
            for buffer, value in self.values:
                buffer.copy_(value)
