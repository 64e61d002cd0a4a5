"""``validate_history`` (and through it ``torchlens.validate_model_activations``, which traces the
model first): prove a trace is the real forward pass.

What a trace claims, and how each claim is checked (every failure names the layer and says why):

1. *Its outputs are the model's.* The logged outputs equal those of a plain run of the model
   with the same seed, on a deep copy of the inputs; no tensor came from an untraced producer.
2. *Its graph is well formed.* Every label finds its own entry; every parent exists, ran before
   its child and lists the child back; the passes of a layer are numbered in execution order.
3. *Each operation is what it says.* The recorded parents are the arguments of the saved call,
   at the recorded positions; re-running the function on the parents' saved activations (with
   the saved non-tensor arguments and, for random operations, the generator state it ran with)
   reproduces the saved activation.
4. *No edge was lost.* A logged tensor among the call's arguments that is not a recorded parent
   (each output of ``broadcast_tensors`` comes from one argument) must not influence the result:
   if some other value of it changes the replay, the trace lost an edge.

Recorded parents are not perturbed. Check 3 already proves that the operation, run on the
recorded parents, gives the saved result. That another value of a parent would give the same
result (``h * 0``, ``h - h``, ``clamp(h, min=k, max=k)``, a softmax over one element, a
comparison that does not flip) is a property of the function for these inputs, not evidence
against the trace: a recorded parent is wrong only when it is not what the operation consumed,
and then either its value does not reproduce the result (check 3) or the structure says so.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ..arguments import ArgumentValueError, check, refuse_type, require_instance
from ..collector import automatic_collection_paused
from .capture import RngState, allocates_uninitialised
from .history.model_history import ModelHistory
from .records.meta import is_meta_history, refuse_meta
from .records.tensor_log import ParentRef, TensorLogEntry
from .replay import replay_entry
from .verdicts import Verdicts, same

# Functions whose output has no meaningful value to compare (uninitialised memory; so has a
# tensor class called with sizes only, torch.Tensor(2, 3): allocates_uninitialised).
UNCOMPARABLE = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"})
# Layers that pass a tensor on unchanged. Their saved call is identity(what they passed on);
# histories saved before pass-throughs recorded it have none, and are still accepted.
_PASS_THROUGH = frozenset({"identity", "output"})
_MAX_DEPTH = 6  # as deep as capture.args looks for tensors in arguments


def validate_history(
    history: ModelHistory, expected_outputs: Optional[Sequence[torch.Tensor]] = None, verbose: bool = False
) -> bool:
    """Checks 2 to 4 of the module docstring on an existing history, and check 1 when
    ``expected_outputs`` (the model's output tensors, in ``tensors_in`` order) are given.

    The history must hold every layer's activation and the function arguments: record it with
    ``log_forward_pass(..., layers_to_save='all', save_function_args=True)`` and no
    ``activation_postfunc``. The caller's RNG state is left as it was.

    Example:
        >>> import torch, torchlens as tl
        >>> from torchlens.trace.validate import validate_history
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> validate_history(tl.log_forward_pass(model, torch.rand(2, 4), save_function_args=True))
        True
    """
    require_instance("history", history, "validate_history", ModelHistory, takes="a ModelHistory")
    check("validate_history", verbose=verbose)
    if expected_outputs is not None and (
        not isinstance(expected_outputs, (list, tuple))
        or not all(isinstance(t, torch.Tensor) for t in expected_outputs)
    ):
        raise refuse_type("validate_history", "expected_outputs", expected_outputs, "a list of tensors (or None)")
    _require_replayable(history)
    rng = RngState()
    try:
        expected = None if expected_outputs is None else list(expected_outputs)
        with automatic_collection_paused():  # the replays' garbage dies young (collector.py)
            return _validate(history, expected, _Report(verbose))
    finally:
        rng.restore()


def _require_replayable(history: ModelHistory) -> None:
    if is_meta_history(history):
        raise refuse_meta("validate_history")
    if len(history) != history.num_tensors:
        raise ArgumentValueError(
            f"validate_history needs every layer, but {history.num_tensors - len(history)} of "
            f"{history.num_tensors} were dropped: record it with layers_to_save='all'."
        )
    unsaved = [e.label for e in history if e.activation is None and e.kind != "untraced"]
    if unsaved:
        raise ArgumentValueError(
            f"validate_history needs every activation, but {len(unsaved)} layers have none "
            f"({', '.join(unsaved[:3])}): record it with layers_to_save='all'."
        )
    without_args = [
        e.label
        for e in history
        if e.kind == "op" and e.func is not None and e.func_args is None and e.func_name not in _PASS_THROUGH
    ]
    if without_args:
        raise ArgumentValueError(
            f"validate_history re-runs each operation, but {without_args[0]} has no saved "
            "arguments: record the history with save_function_args=True."
        )


def _validate(history: ModelHistory, expected: Optional[List[torch.Tensor]], report: "_Report") -> bool:
    ok, by_label = _check_structure(history, report)
    if expected is not None:
        ok = _check_outputs(history, expected, report) and ok
    ok = _check_untraced(history, report) and ok
    return _check_operations(history, by_label, report) and ok


class _Report:
    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose

    def say(self, message: str) -> None:
        if self.verbose:
            print(f"validate_model_activations: {message}")

    def fail(self, message: str) -> bool:
        self.say(message)
        return False


# ----- check 1: outputs and untraced producers -------------------------------------------------
def _check_outputs(history: ModelHistory, expected: List[torch.Tensor], report: _Report) -> bool:
    outputs = [e for e in history if e.is_output]
    if len(outputs) != len(expected):
        return report.fail(f"the model returned {len(expected)} tensors but {len(outputs)} output layers were logged")
    ok = True
    for entry, value in zip(outputs, expected):
        if not same(entry.activation, value, _parts):
            ok = report.fail(
                f"{entry.label} differs from the output of a plain run of the model{_difference(entry.activation, value)}"
            )
    return ok


def _check_untraced(history: ModelHistory, report: _Report) -> bool:
    """An ``untraced`` node is a gap: the call that made its tensor was not logged, so nothing
    can show the tensor is what the model computed, nor what it was computed from."""
    ok = True
    for entry in history:
        if entry.kind != "untraced":
            continue
        where = f" inside module '{entry.containing_module}'" if entry.containing_module else ""
        used_by = ", ".join(entry.child_layers) or "no logged layer"
        unknown = (
            f"how it was computed from {', '.join(entry.parent_layers)} is unknown"
            if entry.parent_layers  # a TorchScript submodule's output: its inputs are known
            else "what it was computed from is unknown"
        )
        ok = report.fail(
            f"{entry.label}: untraced producer{where}, used by {used_by}: {entry.untraced_reason}, so "
            f"{unknown}. Call that computation through a torch function "
            "or a torch.library custom operator (both are logged), or report it to torchlens if "
            "it is a torch function."
        )
    return ok


# ----- check 2: the graph ----------------------------------------------------------------------
def _check_structure(history: ModelHistory, report: _Report) -> Tuple[bool, Dict[str, TensorLogEntry]]:
    """Labels, lookup, edges in both directions, execution order and pass numbers; also returns
    the entries by label (independent of the history's lookup table)."""
    ok = True
    entries = history.layer_list
    index: Dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.label in index:
            ok = report.fail(f"{e.label}: two entries carry this label")
        index[e.label] = i
        try:
            found = history[e.label]
        except KeyError:
            found = None
        if found is not e:
            ok = report.fail(
                f"{e.label}: history[{e.label!r}] finds {getattr(found, 'label', 'nothing')}, not this entry"
            )
    for i, e in enumerate(entries):
        for p in e.parent_layers or ():
            j = index.get(p)
            if j is None:
                ok = report.fail(f"{e.label}: parent {p} is not a layer of this history")
            elif j >= i:
                ok = report.fail(f"{e.label}: parent {p} comes after it in execution order")
            elif e.label not in (entries[j].child_layers or ()):
                ok = report.fail(f"{e.label}: parent {p} does not list it as a child")
        for c in e.child_layers or ():
            j = index.get(c)
            if j is None:
                ok = report.fail(f"{e.label}: child {c} is not a layer of this history")
            elif e.label not in (entries[j].parent_layers or ()):
                ok = report.fail(f"{e.label}: child {c} does not list it as a parent")
    layers: Dict[str, List[TensorLogEntry]] = {}
    for e in entries:
        layers.setdefault(e.layer_label, []).append(e)
    for layer_label, passes in layers.items():
        n = len(passes)
        for k, e in enumerate(passes, 1):
            label = layer_label if n == 1 else f"{layer_label}:{k}"
            if e.pass_num != k or e.num_passes != n or e.label != label:
                ok = report.fail(
                    f"{e.label}: recorded as pass {e.pass_num} of {e.num_passes}, but it ran as "
                    f"pass {k} of {n} of {layer_label} (label {label})"
                )
    return ok, {e.label: e for e in entries}


# ----- checks 3 and 4: each operation -----------------------------------------------------------
def _check_operations(history: ModelHistory, by_label: Dict[str, TensorLogEntry], report: _Report) -> bool:
    ok = True
    generator = torch.Generator().manual_seed(0)
    verdicts: Verdicts[TensorLogEntry] = Verdicts(_parts)  # on a GPU, read once at the end
    guarded = not history.traced_here  # a loaded history's calls come from a file (replay.py)
    for entry in history:
        if entry.kind in ("input", "buffer") or entry.func is None:
            continue
        if entry.func_args is None and not entry.parent_layers:
            continue  # a parentless pass-through without its saved call (an older history): nothing to replay
        refs = _parent_refs(entry) if entry.func_args is not None else None
        if refs is not None:
            ok = _check_arguments(entry, refs, report) and ok
        if entry.func_name in UNCOMPARABLE or allocates_uninitialised(entry.func_name, entry.func_args):
            continue
        with torch.no_grad():
            result = replay_entry(entry, by_label, {}, guarded)
        if isinstance(result, str):
            ok = report.fail(f"{entry.label}: re-running {entry.func_name} failed: {result}")
            continue
        unrecorded = [
            (label, positions) for label, positions in (refs or {}).items() if label not in entry.parent_layers
        ]
        # perturbing an argument needs the verdict first: read at once then (rare: a constant)
        verdict = (
            same(result, entry.activation, _parts) if unrecorded else verdicts.add(entry, result, entry.activation)
        )
        if verdict is False:
            ok = report.fail(_mismatch(entry, result))
            continue
        for label, positions in unrecorded:
            if _depends_on(entry, label, by_label, generator, reference=result, guarded=guarded):
                ok = report.fail(
                    f"{entry.label}: its result depends on the value of {label} (argument "
                    f"{_positions_text(positions)}), which is not a recorded parent: the trace lost an edge"
                )
    for entry in verdicts.failed():  # replayed again for the message's difference
        with torch.no_grad():
            ok = report.fail(_mismatch(entry, replay_entry(entry, by_label, {}, guarded)))
    return ok


def _mismatch(entry: TensorLogEntry, result: Any) -> str:
    return (
        f"{entry.label}: re-running {entry.func_name} on the saved activations of its parents "
        f"({', '.join(entry.parent_layers) or 'none'}) does not reproduce its saved activation"
        f"{_difference(result, entry.activation)}"
    )


def _check_arguments(entry: TensorLogEntry, refs: Dict[str, list], report: _Report) -> bool:
    """Every recorded parent sits in the saved call's arguments at its recorded positions."""
    ok = True
    recorded = entry.parent_arg_positions or {}
    for parent in entry.parent_layers:
        at = refs.get(parent, [])
        positions = recorded.get(parent, [])
        missing = [p for p in positions if p not in at]
        if not positions:
            ok = report.fail(f"{entry.label}: parent {parent} has no recorded argument position")
        elif missing and all(isinstance(_argument_at(entry, p), torch.Tensor) for p in missing):
            continue  # kept as the tensor itself inside an object the saved arguments do not enter
        elif missing:
            where = f"has it at {_positions_text(at)}" if at else "does not have it among its arguments"
            ok = report.fail(
                f"{entry.label}: parent {parent} is recorded as argument {_positions_text(positions)}, "
                f"but the saved call {where}"
            )
    return ok


def _parent_refs(entry: TensorLogEntry) -> Dict[str, list]:
    """Parent label -> positions of its ``ParentRef`` in the saved arguments (positions as in
    ``capture.args.tensors_in_call``; the ``out=`` tensor is not an argument that is read)."""
    found: Dict[str, list] = {}
    for position, ref in _refs_in(entry.func_args, ()):
        found.setdefault(ref.label, []).append(position)
    for key, value in (entry.func_kwargs or {}).items():
        if key != "out":
            for position, ref in _refs_in(value, (key,)):
                found.setdefault(ref.label, []).append(position)
    return found


def _refs_in(value: Any, path: tuple, depth: int = 0) -> Iterator[Tuple[Any, ParentRef]]:
    if isinstance(value, ParentRef):
        yield (path[0] if len(path) == 1 else path), value
    elif depth < _MAX_DEPTH and type(value) in (list, tuple):
        for i, item in enumerate(value):
            yield from _refs_in(item, path + (i,), depth + 1)
    elif depth < _MAX_DEPTH and type(value) is dict:
        for key, item in value.items():
            yield from _refs_in(item, path + (key,), depth + 1)


def _argument_at(entry: TensorLogEntry, position: Any) -> Any:
    path = position if isinstance(position, tuple) else (position,)
    value: Any = entry.func_kwargs if isinstance(path[0], str) else entry.func_args
    try:
        for step in path:
            value = value[step]
    except (KeyError, IndexError, TypeError):
        return None
    return value


def _positions_text(positions: list) -> str:
    return ", ".join(map(str, positions))


def _depends_on(
    entry: TensorLogEntry,
    label: str,
    by_label: Dict[str, TensorLogEntry],
    generator: torch.Generator,
    reference: torch.Tensor,
    guarded: bool,
) -> bool:
    """Some other value of layer ``label``'s activation changes the replayed result (or makes
    the function reject it: an index out of range shows the values matter)."""
    source = by_label.get(label)
    if source is None or not isinstance(source.activation, torch.Tensor):
        return False
    for candidate in _perturbations(source.activation, generator):
        with torch.no_grad():
            changed = replay_entry(entry, by_label, {label: candidate}, guarded)
        if isinstance(changed, str) or not _identical(changed, reference):
            return True
    return False


def _perturbations(value: torch.Tensor, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Random noise, then large negative and large positive values (thresholds, signs and
    comparisons flip for one of them); the negation of a mask; an index moved by one. Nested
    tensors are perturbed component by component, sparse ones in their stored values (their
    indices and size stay: a sparse tensor is never made dense), and both keep their kind."""
    parts = [p.detach() for p in _value_parts(value)]
    if not parts or all(p.numel() == 0 for p in parts):
        return
    if value.dtype == torch.bool:
        yield _with_values(value, [p.logical_not() for p in parts])
        return
    if not (value.is_floating_point() or value.is_complex()):
        yield _with_values(value, [p + 1 for p in parts])
        return
    noises = []
    for part in parts:
        noise = torch.randn(part.shape, generator=generator, dtype=torch.float32).to(part.device)
        if part.is_complex():
            noise = noise * (1 + 1j)
        noises.append(noise.to(part.dtype))
    scale = max((float(p.abs().max()) for p in parts if p.numel()), default=0.0) + 1.0
    for make in (
        lambda p, n: p + n * scale,
        lambda p, n: -p.abs() - (n.abs() + 1) * scale,
        lambda p, n: p.abs() + (n.abs() + 1) * scale,
    ):
        yield _with_values(value, [make(p, n) for p, n in zip(parts, noises)])


# ----- comparing tensors -------------------------------------------------------------------------
_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _parts(t: torch.Tensor) -> List[torch.Tensor]:
    """Strided tensors holding all of ``t``: a nested tensor's components, a sparse tensor's
    indices and values (coalesced), never its dense form (a sparse tensor's size may be far
    larger than its data, and neither kind supports ``torch.equal`` or a plain ``shape``)."""
    if t.is_nested:
        return list(t.unbind())
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        return [t.indices(), t.values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [t.ccol_indices(), t.row_indices(), t.values()]
    return [t]


def _value_parts(t: torch.Tensor) -> List[torch.Tensor]:
    """The parts of ``t`` that hold values (a sparse tensor's indices are structure)."""
    return _parts(t)[-1:] if t.layout != torch.strided and not t.is_nested else _parts(t)


def _with_values(like: torch.Tensor, values: List[torch.Tensor]) -> torch.Tensor:
    """A tensor of ``like``'s kind, structure and size holding ``values`` (see ``_value_parts``)."""
    if like.is_nested:
        return torch.nested.as_nested_tensor(values, layout=like.layout)
    if like.layout == torch.strided:
        return values[0]
    parts = _parts(like)
    if like.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(parts[0], values[0], like.shape, check_invariants=True).coalesce()
    return torch.sparse_compressed_tensor(
        parts[0], parts[1], values[0], like.shape, layout=like.layout, check_invariants=True
    )


def _identical(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.is_nested != b.is_nested or a.layout != b.layout or (not a.is_nested and a.shape != b.shape):
        return False
    parts_a, parts_b = _parts(a), _parts(b)
    return len(parts_a) == len(parts_b) and all(
        x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x, y)) for x, y in zip(parts_a, parts_b)
    )


def _difference(a: Any, b: Any) -> str:
    """`` (largest difference 1.2e-03)``, or how the two differ in kind."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return f" (got {type(a).__name__}, expected {type(b).__name__})"
    if a.is_nested or b.is_nested or a.layout != torch.strided or b.layout != torch.strided:
        return ""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f" (got {tuple(a.shape)} {a.dtype}, expected {tuple(b.shape)} {b.dtype})"
    if a.numel() == 0 or a.dtype == torch.bool:
        return ""
    try:
        wide = (lambda t: t.detach()) if a.is_complex() else (lambda t: t.detach().double())
        return f" (largest difference {float((wide(a) - wide(b)).abs().max()):.3g})"
    except (RuntimeError, TypeError):
        return ""


__all__ = ["validate_history"]
