"""Verdicts on whether replayed results equal their saved activations, read from an
accelerator once at the end instead of once per operation.

Reading a comparison's answer on the host (``torch.equal``, ``allclose``) waits for everything
queued on the device: done per operation, a replay of the whole pass would wait for the device
a hundred times and never keep it busy. Tensors on the CPU are compared at once (reading costs
nothing there); tensors on another device leave a 0-d boolean on it, and ``failed`` reads all of
them in one copy per device.

Example:
    >>> verdicts = Verdicts()
    >>> verdicts.add("a", torch.ones(2), torch.ones(2)), verdicts.add("b", torch.ones(2), torch.zeros(2))
    (True, False)
    >>> verdicts.failed()
    []
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

import torch

Key = TypeVar("Key")
RTOL, ATOL = 1e-4, 1e-6  # the rounding of a different kernel
READ_AT_ONCE = frozenset({"cpu", "meta"})  # device types whose answers cost no wait to read


def same(a: Any, b: Any, parts: Callable[[torch.Tensor], List[torch.Tensor]]) -> bool:
    """Equal up to the rounding of a different kernel (relative ``RTOL``), read now. ``parts``:
    the strided tensors a nested or sparse tensor is made of."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.is_nested or b.is_nested or a.layout != torch.strided or b.layout != torch.strided:
        if a.is_nested != b.is_nested or a.layout != b.layout or (not a.is_nested and a.shape != b.shape):
            return False
        parts_a, parts_b = parts(a), parts(b)
        return len(parts_a) == len(parts_b) and all(same(x, y, parts) for x, y in zip(parts_a, parts_b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = _comparable(a), _comparable(b)
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))
    return False


class Verdicts(Generic[Key]):
    """``same`` for many pairs, the answers of pairs on an accelerator read together."""

    def __init__(self, parts: Callable[[torch.Tensor], List[torch.Tensor]] = lambda t: [t]) -> None:
        self._parts = parts
        self._pending: Dict[torch.device, List[Tuple[Key, torch.Tensor]]] = {}

    def add(self, key: Key, result: Any, saved: Any) -> Optional[bool]:
        """Whether ``result`` equals ``saved`` where that is known without waiting for a device;
        None when the answer stays on the device until ``failed``."""
        verdict = _on_device(result, saved)
        if verdict is None:
            return same(result, saved, self._parts)
        self._pending.setdefault(verdict.device, []).append((key, verdict))
        return None

    def failed(self) -> List[Key]:
        """The keys of the pairs left on a device that differ (one read per device), in the
        order they were added per device; none are left pending after."""
        found: List[Key] = []
        for pending in self._pending.values():
            answers = torch.stack([v for _, v in pending]).cpu().tolist()  # the one wait
            found.extend(key for (key, _), ok in zip(pending, answers) if not ok)
        self._pending = {}
        return found


def unequal(pairs: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> List[int]:
    """The positions of the pairs whose tensors differ in any bit (a tensor compared with its
    own earlier copy: was it written?), with the answers of pairs on an accelerator read in one
    copy per device instead of a wait per pair. Bits, not values: ``-0.0`` after ``0.0`` is a
    change, a NaN left as it was is not (``torch.equal`` says the opposite of both).

    Example:
        >>> nan = torch.tensor([float("nan")])
        >>> unequal([(torch.ones(2), torch.ones(2)), (torch.zeros(1), -torch.zeros(1)), (nan, nan.clone())])
        [1]
    """
    found: List[int] = []
    pending: Dict[torch.device, List[Tuple[int, torch.Tensor]]] = {}
    for i, (a, b) in enumerate(pairs):
        if a.shape != b.shape or a.dtype != b.dtype:
            found.append(i)
            continue
        bits_a, bits_b = _bits(a), _bits(b)
        if bits_a is None or bits_b is None or a.device != b.device:
            if not torch.equal(a, b):
                found.append(i)
        elif a.device.type in READ_AT_ONCE:
            if not torch.equal(bits_a, bits_b):
                found.append(i)
        else:
            pending.setdefault(a.device, []).append((i, torch.eq(bits_a, bits_b).all()))
    for waiting in pending.values():
        answers = torch.stack([v for _, v in waiting]).cpu().tolist()  # the one wait
        found.extend(i for (i, _), same_bits in zip(waiting, answers) if not same_bits)
    return sorted(found)


_BITS = ((8, torch.int64), (4, torch.int32), (2, torch.int16))  # else the bytes themselves


def _bits(t: torch.Tensor) -> Optional[torch.Tensor]:
    """A dense tensor's bytes as a flat integer tensor of the widest kind that divides them (no
    copy); None for other layouts, quantized and non-contiguous tensors."""
    if type(t) is not torch.Tensor or t.layout != torch.strided or t.is_quantized or not t.is_contiguous():
        return None
    try:
        data = t.reshape(-1).view(torch.uint8)
    except RuntimeError:  # a dtype whose bytes torch does not view (a view of a different kind)
        return None
    for size, kind in _BITS:
        if data.numel() % size == 0:
            return data.view(kind)
    return data


def _on_device(a: Any, b: Any) -> Optional[torch.Tensor]:
    """The 0-d boolean ``same(a, b)`` on their device, for two plain tensors of one shape, dtype
    and non-CPU device; None for anything else (compared on the host)."""
    if not (type(a) is torch.Tensor and type(b) is torch.Tensor):
        return None
    if a.device != b.device or a.device.type in READ_AT_ONCE or a.layout != torch.strided:
        return None
    if b.layout != torch.strided or a.is_nested or b.is_nested or a.shape != b.shape or a.dtype != b.dtype:
        return None
    a, b = _comparable(a), _comparable(b)
    if a.is_floating_point() or a.is_complex():
        return torch.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True).all()
    return (a == b).all()


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype torch can compare: float8 has no kernels for it (``equal``, ``isclose``),
    and every float8 value is exact in float32."""
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


__all__ = ["Verdicts", "same", "unequal", "RTOL", "ATOL"]
