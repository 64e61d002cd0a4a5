"""``tl.compare``: where two passes of a model (or of a model and its port) part.

Ops are matched (``matching.py``), then compared one pair at a time in ``a``'s execution order:
each activation is read when its pair comes (a history loaded with ``tl.load`` reads it from
disk then and does not keep it), so two histories on disk are never both whole in memory.
"""

from __future__ import annotations

import math
import os
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ....arguments import ArgumentTypeError, check, require_float
from ...api import log_forward_pass
from ...history.model_history import ModelHistory
from ...input_copy import as_args, as_kwargs, copy_inputs, require_model
from ...records.func_call import FuncCallLocation
from ...records.meta import is_meta_history, refuse_meta
from ...records.tensor_log import TensorLogEntry
from ..source import source_of
from .difference import Difference, difference
from .matching import Matching, match_histories
from .report import ComparedOp, CompareError, Comparison, NothingInCommonError

Side = Union[ModelHistory, Sequence[Any]]

# Below this share of the smaller pass's operations matched, two passes have nothing in common.
MIN_SHARED = 0.2
# layer types (without underscores) whose values are copies of their parents' values
MOVES_VALUES = frozenset(
    "view reshape transpose permute contiguous split chunk unbind getitem select narrow slice expand expandas "
    "squeeze unsqueeze flatten unflatten t clone detach cat concat concatenate stack indexselect gather repeat "
    "tile flip roll movedim swapaxes swapdims output identity".split()
)
# of those, the ones whose output holds each of its parent's values exactly once
REARRANGES = frozenset(
    "view reshape transpose permute contiguous flatten unflatten squeeze unsqueeze t clone detach identity "
    "output movedim swapaxes swapdims".split()
)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def compare(
    a: Side, b: Side, rtol: float = 1e-3, atol: float = 1e-5, *, random_seed: Optional[int] = None
) -> Comparison:
    """Compare two passes op by op and name where they part: ``cmp.first_divergence`` is the
    first op beyond tolerance whose matched parents are all within it (the origin of the
    difference, not the ops it flowed into), None when every matched op is within tolerance.

    Args:
        a, b: each a ``ModelHistory`` with saved activations (``log_forward_pass``, ``tl.load``),
            or ``(model, args)`` / ``(model, args, kwargs)``: traced here with
            ``log_forward_pass`` (every activation saved), both with the same random seed; the
            models end as they were.
        rtol, atol: an op is within tolerance when every element has
            ``|a - b| <= atol + rtol * |b|`` (``torch.allclose``'s rule; ``b`` is the reference).
            Integer and boolean values are compared exactly, complex ones by ``|a - b|``.
        random_seed: the seed of both traces (random if None).

    Ops are matched by label when both passes have the same structure, else by module, layer
    type and place, and along edges (see the README, "Answers: where two passes part").
    Raises ``CompareError`` when a history holds no activations or lacks those of matched ops
    (naming them and the ``layers_to_save`` that keeps them), ``NothingInCommonError`` when
    the passes share almost no ops.

    Example:
        >>> import torch, torchlens as tl
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        >>> changed = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        >>> changed.load_state_dict(model.state_dict())
        <All keys matched successfully>
        >>> with torch.no_grad():
        ...     changed[2].bias += 1.0
        >>> cmp = tl.compare((model, torch.ones(1, 3)), (changed, torch.ones(1, 3)))
        >>> cmp.first_divergence.label, cmp.first_divergence.module
        ('linear_2_3', '2')
    """
    check("compare", rtol=require_float("rtol", rtol, "compare"), atol=require_float("atol", atol, "compare"))
    check("compare", random_seed=random_seed)
    seed = random.SystemRandom().randrange(2**32) if random_seed is None else int(random_seed)
    history_a = _history(a, "a", seed=seed, copy=True)
    history_b = _history(b, "b", seed=seed, copy=False)
    traced = not isinstance(a, ModelHistory) and not isinstance(b, ModelHistory)
    result = compare_histories(history_a, history_b, rtol=rtol, atol=atol, traced_here=traced)
    result.dtypes_differ = _dtypes_differ(history_a, history_b)
    return result


def _main_dtype(history: ModelHistory) -> Optional[torch.dtype]:
    """The floating dtype most of the pass's operations compute in."""
    counts: Dict[torch.dtype, int] = {}
    for e in history.layer_list:
        if e.kind not in ("input", "output") and isinstance(e.dtype, torch.dtype) and e.dtype.is_floating_point:
            counts[e.dtype] = counts.get(e.dtype, 0) + 1
    return max(counts, key=lambda d: counts[d]) if counts else None


def _dtypes_differ(a: ModelHistory, b: ModelHistory) -> Optional[str]:
    """What to say when the two passes compute in different floating dtypes: every op then
    differs by the coarser one's rounding, which says nothing about where a bug is."""
    dtype_a, dtype_b = _main_dtype(a), _main_dtype(b)
    if dtype_a is None or dtype_b is None or dtype_a == dtype_b:
        return None
    low = min((dtype_a, dtype_b), key=lambda d: torch.finfo(d).bits)
    step = torch.finfo(low).eps
    name = str(low).replace("torch.", "")
    return (
        f"Dtypes differ: a computes in {str(dtype_a).replace('torch.', '')}, b in {str(dtype_b).replace('torch.', '')}, "
        f"so every op differs by {name}'s rounding (steps of {step:.2g}) and ops beyond tolerance below say "
        f"little. To see which ops lose precision in {name}, use tl.compare_precision(model, x, dtype=torch.{name}) "
        f"(each op against float64, ranked by the error it adds); to compare anyway, pass tolerances for {name} "
        f"(rtol={2 * step:.2g})."
    )


def _history(side: Side, name: str, *, seed: int, copy: bool) -> ModelHistory:
    if isinstance(side, ModelHistory):
        return side
    if not isinstance(side, (tuple, list)) or len(side) not in (2, 3):
        raise ArgumentTypeError(
            f"compare: {name} must be a ModelHistory or a tuple (model, args) or (model, args, kwargs), "
            f"not {type(side).__name__}; e.g. tl.compare((model_a, x), (model_b, x))."
        )
    model = side[0]
    require_model(model, "compare")
    args, kwargs = as_args(side[1]), as_kwargs(side[2] if len(side) == 3 else None)
    if copy:  # the first trace gets copies, so the second sees the inputs as the caller gave them
        args, kwargs, _ = copy_inputs(model, args, kwargs)
    return log_forward_pass(model, args, kwargs, random_seed=seed, detach_saved_tensors=True)


def compare_histories(
    a: ModelHistory,
    b: ModelHistory,
    *,
    rtol: float,
    atol: float,
    saturation: Optional[float] = None,
    traced_here: bool = False,
) -> Comparison:
    """``compare`` of two histories (what ``compare`` does once both are traced); see
    ``difference`` for ``saturation``. ``traced_here``: both were traced by torchlens here,
    saving the tensors as they were (ops that only rearrange their parent's values then take
    its numbers instead of being measured again)."""
    for history, name in ((a, "a"), (b, "b")):
        if is_meta_history(history):
            raise refuse_meta(f"compare (history {name})")
        _require_values(history, name)
    matching = match_histories(a, b)
    _require_shared(a, b, matching)
    pairs, notes = _saved_pairs(matching)
    notes += [f"{side}: {note}" for side, h in (("a", a), ("b", b)) for note in getattr(h, "notes", ())]
    rows = _rows(pairs, matching.how, tolerance=(rtol, atol, saturation), shortcut=traced_here)
    return Comparison(
        rows=rows,
        unmatched_a=matching.unmatched_a,
        unmatched_b=matching.unmatched_b,
        rtol=rtol,
        atol=atol,
        name_a=a.model_name,
        name_b=b.model_name,
        matched_by_label=matching.by_label,
        notes=notes,
        history_a=a,
        history_b=b,
    )


def _require_values(history: ModelHistory, name: str) -> None:
    if not any(e.has_saved_activation for e in history.layer_list):
        raise CompareError(
            f"compare: history {name} holds no saved activations (it was traced with layers_to_save=None, "
            "or is metadata only), so there is nothing to compare. Trace it with "
            "log_forward_pass(model, x, layers_to_save='all'), or pass (model, x) to tl.compare to trace it there."
        )


def _require_shared(a: ModelHistory, b: ModelHistory, matching: Matching) -> None:
    if matching.by_label:
        return
    ops_a = sum(1 for e in a.layer_list if e.kind not in ("input", "output"))
    ops_b = sum(1 for e in b.layer_list if e.kind not in ("input", "output"))
    shared = sum(1 for ea, _ in matching.pairs if ea.kind not in ("input", "output"))
    if shared == 0 or shared < MIN_SHARED * min(ops_a, ops_b):
        raise NothingInCommonError(
            f"compare: {a.model_name} (a) and {b.model_name} (b) have almost nothing in common: {shared} of their "
            f"{ops_a} and {ops_b} operations matched (by module, layer type and edges). Compare two passes of the "
            "same computation (a model and its port, two precisions, before and after a change)."
        )


def _saved_pairs(matching: Matching) -> Tuple[List[Tuple[TensorLogEntry, TensorLogEntry]], List[str]]:
    """The pairs with both activations saved; an error naming the ops saved on one side only."""
    lack_a = list(matching.missing_a)
    lack_b = list(matching.missing_b)
    pairs, neither = [], 0
    for ea, eb in matching.pairs:
        saved_a, saved_b = ea.has_saved_activation, eb.has_saved_activation
        if saved_a and saved_b:
            pairs.append((ea, eb))
        elif saved_a:
            lack_b.append(eb.label)
        elif saved_b:
            lack_a.append(ea.label)
        else:
            neither += 1
    for name, lack in (("a", lack_a), ("b", lack_b)):
        if lack:
            shown = ", ".join(lack[:12]) + (f", ... ({len(lack)} in all)" if len(lack) > 12 else "")
            raise CompareError(
                f"compare: history {name} lacks the saved activations of {len(lack)} ops the other history has: "
                f"{shown}. Trace {name} again with layers_to_save={lack!r} added to its layers_to_save (or "
                "layers_to_save='all'), or trace the other with the same layers_to_save as this one."
            )
    notes = [f"{neither} matched ops saved on neither side were not compared."] if neither else []
    return pairs, notes


def _value(entry: TensorLogEntry) -> Any:
    """The activation; a loaded history's is read from disk without being kept on the entry."""
    pending = getattr(entry, "_pending", None)
    if pending and "activation" in pending:
        return entry._decoder.value(pending["activation"])  # type: ignore[attr-defined]
    return entry.activation


def _rows(
    pairs: List[Tuple[TensorLogEntry, TensorLogEntry]],
    how: Dict[str, str],
    *,
    tolerance: Tuple[float, float, Optional[float]],
    shortcut: bool = False,
) -> List[ComparedOp]:
    rtol, atol, saturation = tolerance
    rows: List[ComparedOp] = []
    by_label: Dict[str, ComparedOp] = {}
    entries: Dict[str, Tuple[TensorLogEntry, TensorLogEntry]] = {}
    compared_b = {eb.label for _, eb in pairs}
    for ea, eb in pairs:
        parents = [by_label[p] for p in ea.parent_layers if p in by_label]
        d = _rearranged(ea, eb, parents, entries) if shortcut else None
        if d is None:
            d = difference(_value(ea), _value(eb), rtol=rtol, atol=atol, saturation=saturation)
        row = ComparedOp(
            label_a=ea.label,
            label_b=eb.label,
            layer_type=ea.layer_type,
            module=ea.containing_module,
            shape_a=_shape(ea.shape),
            shape_b=_shape(eb.shape),
            within=d.within and d.same_shape,
            max_abs=d.max_abs,
            max_rel=d.max_rel,
            mean_rel=d.mean_rel,
            rel_error=d.rel_error,
            cosine=d.cosine,
            exact=d.exact,
            parents=[p.label_a for p in parents],
            matched_by=how.get(ea.label, "label"),
            note=d.note,
        )
        row.is_origin = not row.within and all(p.within for p in parents)
        row.added = _added(row, parents)
        if row.is_origin:
            row.source = _user_source(ea)
            alone = [f"{p} (a)" for p in ea.parent_layers if p not in by_label]
            alone += [f"{p} (b)" for p in eb.parent_layers if p not in compared_b]
            if alone:  # the difference may come from there
                row.note = f"it also reads ops not compared (unmatched or not saved): {', '.join(alone)}"
        rows.append(row)
        by_label[ea.label] = row
        entries[ea.label] = (ea, eb)
    return rows


def _rearranged(
    ea: TensorLogEntry,
    eb: TensorLogEntry,
    parents: List[ComparedOp],
    entries: Dict[str, Tuple[TensorLogEntry, TensorLogEntry]],
) -> Optional[Difference]:
    """The parent's numbers, for an op whose values are its one parent's, rearranged (a view,
    a transpose, a contiguous copy) on both sides: every number of a row (maxima, means, norms,
    cosine) is the same for any order of the elements. Only for histories traced here, whose
    saved values are the tensors themselves (no ``activation_postfunc``)."""
    if ea.layer_type.replace("_", "") not in REARRANGES or len(ea.parent_layers) != 1 or len(parents) != 1:
        return None
    p = parents[0]
    if eb.parent_layers != [p.label_b] or not p.same_shape or p.shape_a is None or ea.shape != eb.shape:
        return None
    pa, pb = entries[p.label_a]
    if ea.dtype != pa.dtype or eb.dtype != pb.dtype or math.prod(ea.shape) != math.prod(p.shape_a):
        return None
    return Difference(
        same_shape=True,
        within=p.within,
        exact=p.exact,
        max_abs=p.max_abs,
        max_rel=p.max_rel,
        mean_rel=p.mean_rel,
        rel_error=p.rel_error,
        cosine=p.cosine,
        note=p.note,
    )


def _added(row: ComparedOp, parents: List[ComparedOp]) -> Optional[float]:
    """The op's mean relative error beyond the worst of its parents' (0 when it adds none;
    always 0 for ops that only move values: a split's third of its parent has a mean error of
    its own, but not one the split made)."""
    if row.mean_rel is None:
        return None
    if row.layer_type.replace("_", "") in MOVES_VALUES and parents:
        return 0.0
    worst = max((p.mean_rel for p in parents if p.mean_rel is not None), default=0.0)
    added = row.mean_rel - worst
    return added if added > 1e-6 * row.mean_rel else 0.0  # below that: rounding of the means


def _user_source(entry: TensorLogEntry) -> Optional[FuncCallLocation]:
    """The line that called the op, in the model's code: the last frame outside torch itself
    (``self.fc(x)``, not ``F.linear`` inside ``nn.Linear``)."""
    for location in reversed(entry.func_call_stack):
        if not os.path.abspath(location.file).startswith(_TORCH_DIR):
            return location
    return source_of(entry)


def _shape(shape: Any) -> Optional[Tuple[int, ...]]:
    return tuple(int(n) for n in shape) if shape is not None else None


__all__ = ["compare", "compare_histories", "MIN_SHARED"]
