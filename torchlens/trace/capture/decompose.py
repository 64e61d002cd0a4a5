"""Fused attention run as its math, so its probabilities become ops (``decompose=("sdpa",)``).

``F.scaled_dot_product_attention`` (what HF models and ``nn.MultiheadAttention`` call) computes
``softmax(q @ k^T * scale + mask) @ v`` in one kernel: the probabilities never exist as a
tensor, and the trace shows one ``scaledotproductattention`` op. With the option on, the tracer
runs each such call by ``sdpa_math`` instead, whose torch calls go through the wrappers like
the model's own: matmul, mul, masked_fill/add, the softmax (layer type ``attnsoftmax``, so
``history['attnsoftmax_1_9']``, ``layers_to_save=['attnsoftmax']``), dropout, matmul, all
under the module that made the call. The output is the fused one within rounding (README:
"Attention patterns"). ``nn.MultiheadAttention``'s fast path (``torch._native_multi_head_attention``,
one C++ call that does not come back through Python) is switched off for the pass
(``FastPathOff``), so the module takes its Python path, which calls ``scaled_dot_product_attention``
(``need_weights=False``) or computes its weights with a softmax of its own (``need_weights=True``).

What "the same" means, measured on torch 2.14 (tests/test_decompose_attention.py):

- float16/bfloat16 are computed in float32 and cast back, as torch's math path does on the CPU;
  the probabilities are float32 there.
- Rows whose every key is masked get probability 0 (``torch._safe_softmax``), as the fused
  kernels give output 0 there (a plain softmax would give NaN).
- Dropout (``dropout_p > 0``): ``torch.dropout`` on the probabilities, one Bernoulli draw per
  probability from the default generator. On the CPU torch's own kernel draws the same numbers
  in the same order, so a seeded pass gives the fused output. CUDA's flash and memory-efficient
  kernels draw inside the kernel (Philox, their own offsets): the mask differs, the output is a
  different sample of the same distribution, not the same numbers.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, FrozenSet, Iterable, Optional, Tuple, Union

import torch

from ...arguments import describe
from ...errors import TorchlensError
from ..records.attention import ATTENTION_TYPE
from .decorate import _make_wrapper
from .hooks import PassHook
from .ops import OpInfo

# name users pass -> what it decomposes
DECOMPOSABLE = {
    "sdpa": "torch.nn.functional.scaled_dot_product_attention, and nn.MultiheadAttention (its fast path is off)",
}
_SDPA_NAME = "scaled_dot_product_attention"
# The probabilities' op: torch's softmax through a wrapper of its own whose layer type is
# ATTENTION_TYPE from the start, so layers_to_save=['attnsoftmax'] finds it during the pass. A row
# whose every key is masked is 0 (torch._safe_softmax), as in the fused kernels (softmax: NaN).
_SOFTMAX = getattr(torch, "_safe_softmax", torch.softmax)  # torch >= 2.5 has _safe_softmax
_attention_softmax = _make_wrapper(
    getattr(_SOFTMAX, "__wrapped__", _SOFTMAX), OpInfo(_SOFTMAX.__name__, ATTENTION_TYPE, False)
)


class DecomposeError(TorchlensError, ValueError):
    """``decompose=`` named something torchlens cannot decompose."""


def check_decompose(decompose: Union[None, str, Iterable[str]]) -> FrozenSet[str]:
    """The names in ``decompose=`` (a name or several), checked.

    Example:
        >>> sorted(check_decompose(("sdpa",))), sorted(check_decompose(None))
        (['sdpa'], [])
    """
    if decompose is None:
        return frozenset()
    if not isinstance(decompose, (str, list, tuple, set, frozenset)):
        raise DecomposeError(
            f"decompose takes a name or a tuple of names such as ('sdpa',), not {describe(decompose)}."
        )
    names = (decompose,) if isinstance(decompose, str) else tuple(decompose)
    unknown = [n for n in names if not isinstance(n, str) or n not in DECOMPOSABLE]
    if unknown:
        valid = "; ".join(f"{name!r}: {what}" for name, what in DECOMPOSABLE.items())
        raise DecomposeError(f"decompose: unknown name(s) {', '.join(map(repr, unknown))}. Valid names: {valid}.")
    return frozenset(names)


class Decompositions(PassHook):
    """The pass hook that runs the chosen calls as their math (see the module docstring)."""

    def __init__(self, names: FrozenSet[str]) -> None:
        self.before_calls = frozenset([_SDPA_NAME]) if "sdpa" in names else frozenset()

    def before_call(
        self, name: str, func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Callable[..., Any]:
        return choose_sdpa(func, args, kwargs)


def decompositions(names: FrozenSet[str]) -> Optional[Decompositions]:
    """The pass hook for ``decompose=names`` (checked by ``check_decompose``), or None for none."""
    return Decompositions(names) if names else None


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def choose_sdpa(original: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Callable[..., Any]:
    """``sdpa_math`` for dense tensors; the original call where torch would refuse the arguments
    (then it raises its own error) or the tensors are of a kind the math is not written for."""
    call = dict(zip(_SDPA_PARAMS, args), **kwargs)
    tensors = [call.get(n) for n in ("query", "key", "value", "attn_mask")]
    plain = all(
        t is None or (type(t) is torch.Tensor and t.layout == torch.strided and not t.is_nested) for t in tensors
    )
    query, key, value, mask = tensors
    if not plain or query is None or key is None or value is None or (call.get("is_causal") and mask is not None):
        return original
    if min(query.dim(), key.dim(), value.dim()) >= 3 and not _heads_fit(
        query.size(-3), key.size(-3), value.size(-3), bool(call.get("enable_gqa"))
    ):
        return original
    return sdpa_math


def _heads_fit(query_heads: int, key_heads: int, value_heads: int, gqa: bool) -> bool:
    """Whether torch accepts these head counts (else it raises, and its message is the one to see)."""
    if key_heads == query_heads and value_heads == query_heads:
        return True
    return gqa and key_heads == value_heads and key_heads > 0 and query_heads % key_heads == 0


def sdpa_math(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` as separate torch calls (see the module docstring).

    Example:
        >>> import torch
        >>> q = torch.randn(1, 2, 4, 8)
        >>> fused = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        >>> torch.allclose(sdpa_math(q, q, q, is_causal=True), fused, atol=1e-6)
        True
    """
    dtype = query.dtype
    if dtype in (torch.float16, torch.bfloat16):  # as torch's math path: computed in float32
        query, key, value = query.float(), key.float(), value.float()
        if attn_mask is not None and attn_mask.dtype == dtype:
            attn_mask = attn_mask.float()
    if enable_gqa and key.size(-3) != query.size(-3):  # each k/v head serves a group of q heads
        groups = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    factor = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    # functions of their own (@, swapaxes): inside a torch function that logs its inner calls at
    # its own call site (F.multi_head_attention_forward), a second matmul or a transpose would
    # read as another pass of the first or of that function's own
    scores = (query @ torch.swapaxes(key, -2, -1)) * factor
    if is_causal:  # top-left aligned, as torch's is_causal
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:  # True: may attend
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    probs = _attention_softmax(scores, -1)
    weights = torch.dropout(probs, dropout_p, True) if dropout_p > 0 else probs
    out = torch.matmul(weights, value)
    return out.to(dtype) if out.dtype != dtype else out


class FastPathOff:
    """Switches ``nn.MultiheadAttention``'s (and ``nn.TransformerEncoderLayer``'s) fused fast path
    off while entered, so their attention runs through ``scaled_dot_product_attention``.

    Example:
        >>> with FastPathOff(True):
        ...     torch.backends.mha.get_fastpath_enabled()
        False
        >>> torch.backends.mha.get_fastpath_enabled()
        True
    """

    def __init__(self, active: bool) -> None:
        self.active = active
        self.before: Optional[bool] = None

    def __enter__(self) -> "FastPathOff":
        if self.active:
            self.before = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.before is not None:
            torch.backends.mha.set_fastpath_enabled(self.before)
            self.before = None


__all__ = ["check_decompose", "Decompositions", "decompositions", "sdpa_math", "FastPathOff", "DecomposeError"]
