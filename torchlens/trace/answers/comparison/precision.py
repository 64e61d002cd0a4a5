"""``tl.compare_precision``: which ops lose precision in a lower dtype, against float64."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from ....arguments import ArgumentTypeError, check
from ....errors import TorchlensError
from ...api import log_forward_pass
from ...capture import add_note
from ...input_copy import as_args, as_kwargs, require_model
from .compare_passes import compare_histories
from .report import ComparedOp, Comparison

# torch.testing.assert_close's default tolerances per dtype (rtol, atol)
_TOLERANCES = {
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


@dataclass(repr=False)
class PrecisionComparison(Comparison):
    """A ``Comparison`` of the pass in ``dtype`` (a) against float64 (b), with ``ranking``:
    the ops by the relative error each adds (``row.added``), largest first."""

    dtype: Optional[torch.dtype] = None

    @property
    def ranking(self) -> List[ComparedOp]:
        rows = [r for r in self.rows if r.added is not None and r.added > 0]
        return sorted(rows, key=lambda r: -r.added)  # type: ignore[operator]

    def __str__(self) -> str:
        ranked = self.ranking[:10]
        lines = [f"Precision of {self.name_a} in {self.dtype} against float64 (mean relative error per element)."]
        if ranked:
            lines.append("Ops adding the most error (their own relative error beyond the worst of their parents'):")
            width = max(len(r.label_a) for r in ranked)
            for r in ranked:
                where = f"  in {r.module}" if r.module else ""
                lines.append(f"  {r.label_a.ljust(width)}  adds {r.added:.3g} (mean rel {r.mean_rel:.3g}){where}")
        else:
            lines.append("No op adds error.")
        return "\n".join(lines) + "\n\n" + super().__str__()


def compare_precision(
    model: nn.Module,
    input_args: Any,
    input_kwargs: Optional[Dict[str, Any]] = None,
    dtype: torch.dtype = torch.bfloat16,
    *,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    random_seed: Optional[int] = None,
) -> PrecisionComparison:
    """Trace a float64 copy of ``model`` and a copy in ``dtype`` and rank the ops by the
    error each ADDS: its mean relative error per element (``|a - b| / |b|``, each at most 1,
    over elements with ``|b| > atol``) beyond the worst of its parents',
    so ops that lose precision themselves (softmax, layer_norm, exp, long accumulations) stand
    out from those that only pass on what they were given. ``cmp.ranking`` lists them, largest
    first; the rest is a ``Comparison`` (``first_divergence``, ``rows``, ``to_pandas()``).

    The model is deep-copied twice (it is untouched); floating inputs are cast to each dtype,
    others (token ids, masks of bools) passed as they are. ``rtol`` and ``atol`` default to
    ``torch.testing.assert_close``'s for ``dtype`` (bfloat16: 1.6e-2 and 1e-5).

    Example:
        >>> import torch, torchlens as tl
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.softmax(x * 30, dim=-1)
        >>> _ = torch.manual_seed(0)  # which op adds most depends on the values drawn
        >>> cmp = tl.compare_precision(Model(), torch.randn(2, 8), dtype=torch.float16)
        >>> [r.layer_type for r in cmp.ranking][:1]
        ['softmax']
    """
    require_model(model, "compare_precision")
    check("compare_precision", rtol=rtol, atol=atol, random_seed=random_seed)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArgumentTypeError(
            f"compare_precision: dtype must be a floating torch.dtype such as torch.bfloat16, not {dtype!r}."
        )
    default_rtol, default_atol = _TOLERANCES.get(dtype, (1e-3, 1e-5))
    seed = random.SystemRandom().randrange(2**32) if random_seed is None else int(random_seed)
    args, kwargs = as_args(input_args), as_kwargs(input_kwargs)
    histories = []
    for cast in (dtype, torch.float64):
        copied = copy.deepcopy(model).to(cast)
        call_args, call_kwargs = _cast((args, kwargs), cast)
        try:
            histories.append(
                log_forward_pass(copied, call_args, call_kwargs, random_seed=seed, detach_saved_tensors=True)
            )
        except Exception as error:
            if not isinstance(error, TorchlensError):
                add_note(error, _failed_in(cast))
            raise
        finally:
            del copied
    plain = compare_histories(
        histories[0],
        histories[1],
        rtol=default_rtol if rtol is None else rtol,
        atol=default_atol if atol is None else atol,
        saturation=torch.finfo(dtype).max,  # masks filled with finfo(dtype).min on both sides agree
        traced_here=True,
    )
    fields = {name: getattr(plain, name) for name in plain.__dataclass_fields__}
    fields["name_b"] = f"{fields['name_b']} (float64)"
    return PrecisionComparison(**fields, dtype=dtype)


def _failed_in(dtype: torch.dtype) -> str:
    others = ", ".join(str(d) for d in (torch.float16, torch.bfloat16, torch.float32) if d != dtype)
    return (
        f"torchlens: compare_precision ran a copy of the model in {dtype} (its parameters, buffers "
        "and floating inputs cast to it), and the model raised there: an operation it uses may have "
        f"no {dtype} version on this device. Try another dtype ({others})."
    )


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """A copy of nested tuples, lists and dicts with floating tensors cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(dtype) if value.is_floating_point() else value.clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_cast(v, dtype) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


__all__ = ["compare_precision", "PrecisionComparison"]
