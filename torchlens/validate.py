"""``validate_model_activations``: prove the saved activations are those of the real pass.

Three checks (each failure is reported with the layer and the reason):

1. the logged outputs equal the outputs of a plain run with the same inputs and seed, and no
   tensor came from an untraced producer (a call torchlens does not wrap);
2. re-running each operation on the saved activations of its parents (with its saved
   non-tensor arguments and, for random operations, the generator state it ran with)
   reproduces its saved activation;
3. replacing one parent's activation with a different value changes the result, so every
   recorded edge is a real dependency — except where the table ``PERTURBATION_EXEMPT`` says a
   change is legitimately invisible.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .api import _as_args, log_forward_pass
from .capture.args import replace_tensors, tensors_in
from .capture.modules import BufferSnapshot
from .capture.run import RngState, seed_everything
from .capture.tracer import empty_out
from .history.model_history import ModelHistory
from .history.tensor_log import ParentRef, TensorLogEntry

# Functions (by name) whose output does not depend on the *values* of some arguments, with the
# argument positions that are exempt ("all": every tensor argument) and why.
PERTURBATION_EXEMPT: Dict[str, Tuple[Any, str]] = {
    **{name: ("all", "output depends only on the argument's shape, dtype or device")
       for name in ("zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
                    "randint_like", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor",
                    "new_empty_strided", "expand_as", "view_as", "reshape_as", "type_as",
                    "size", "empty", "empty_strided")},
    **{name: ((0,), "the argument's values are overwritten") for name in ("fill_", "zero_", "copy_")},
    "__setitem__": ((0,), "a slice of the argument is overwritten and may cover all of it"),
    "setitem": ((0,), "a slice of the argument is overwritten and may cover all of it"),
    "batch_norm": ((3, 4, "running_mean", "running_var"),
                   "in training mode the running statistics are updated, not used"),
    **{name: ((0,), "an in-place random fill overwrites the argument's values")
       for name in ("bernoulli_", "uniform_", "normal_", "exponential_", "geometric_", "cauchy_",
                    "log_normal_", "random_")},
    "to": ((1, "other"), "x.to(other) takes only the dtype and device of other"),
    "write_through_view": ((0,), "the view written into may cover all of the base"),
}

# Functions whose output has no meaningful value to compare (uninitialised memory).
UNCOMPARABLE = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"})


def validate_model_activations(
    model: nn.Module,
    input_args: Any,
    input_kwargs: Optional[Dict[str, Any]] = None,
    random_seed: Optional[int] = None,
    verbose: bool = False,
) -> bool:
    """True if the activations torchlens saves are exactly those of the real forward pass.

    The model is left as it was found: parameters, buffers and the caller's RNG state.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Dropout())
        >>> tl.validate_model_activations(model, torch.rand(2, 4), random_seed=0)
        True
    """
    seed = random.SystemRandom().randrange(2**32) if random_seed is None else int(random_seed)
    # copies, so a model that writes into its inputs sees the same values in both runs
    args = replace_tensors(_as_args(input_args), torch.clone)
    kwargs = replace_tensors(dict(input_kwargs or {}), torch.clone)
    logged_args, logged_kwargs = replace_tensors(args, torch.clone), replace_tensors(kwargs, torch.clone)
    report = _Report(verbose)
    rng = RngState()
    buffers = BufferSnapshot(model)
    params: List[Tuple[torch.Tensor, torch.Tensor]] = []
    try:
        if any(is_lazy(p) for p in model.parameters()):
            # lazy modules (nn.LazyLinear) create their parameters first, from the caller's random
            # streams as in a plain forward: the seeded runs below must draw the same numbers
            with torch.no_grad():
                model(*replace_tensors(args, torch.clone), **replace_tensors(kwargs, torch.clone))
            buffers.restore()
        params = [(p, p.detach().clone()) for p in model.parameters()]
        seed_everything(seed)
        expected = [t.detach().clone() for _, t in tensors_in(model(*args, **kwargs))]
        buffers.restore()
        history = log_forward_pass(model, list(logged_args), logged_kwargs, layers_to_save="all",
                                   save_function_args=True, detach_saved_tensors=True, random_seed=seed)
        ok = _check_outputs(history, expected, report)
        ok = _check_untraced(history, report) and ok
        ok = _check_replays(history, report) and ok
        return ok
    finally:
        buffers.restore()
        with torch.no_grad():
            for p, value in params:
                if not torch.equal(p, value):
                    p.copy_(value)
        rng.restore()


class _Report:
    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose

    def fail(self, message: str) -> bool:
        if self.verbose:
            print(f"validate_model_activations: {message}")
        return False


def _parts(t: torch.Tensor) -> List[torch.Tensor]:
    """Strided tensors holding ``t``'s values: a nested tensor's components, a sparse tensor's
    dense form (neither kind supports ``torch.equal`` or a plain ``shape``)."""
    if t.is_nested:
        return list(t.unbind())
    if t.layout != torch.strided:
        return [t.to_dense()]
    return [t]


def _from_parts(like: torch.Tensor, parts: List[torch.Tensor]) -> torch.Tensor:
    """A tensor of ``like``'s kind (strided, nested, sparse) with the values of ``parts``."""
    if like.is_nested:
        return torch.nested.as_nested_tensor(parts, layout=like.layout)
    if like.layout != torch.strided:
        return parts[0].to_sparse(layout=like.layout)
    return parts[0]


def _random_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    parts = [torch.randn(p.shape, generator=generator).to(p.dtype) for p in _parts(t)]
    return _from_parts(t, parts)


def _same(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.is_nested or b.is_nested or a.layout != torch.strided or b.layout != torch.strided:
        if a.is_nested != b.is_nested or a.layout != b.layout:
            return False
        parts_a, parts_b = _parts(a), _parts(b)
        return len(parts_a) == len(parts_b) and all(map(_same, parts_a, parts_b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True))
    return False


def _check_outputs(history: ModelHistory, expected: List[torch.Tensor], report: _Report) -> bool:
    outputs = [history[label] for label in history.output_layers]
    if len(outputs) != len(expected):
        return report.fail(f"the model returned {len(expected)} tensors but {len(outputs)} output layers were logged")
    for entry, value in zip(outputs, expected):
        if not _same(entry.activation, value):
            return report.fail(f"{entry.label} differs from the output of a plain run of the model")
    return True


def _check_untraced(history: ModelHistory, report: _Report) -> bool:
    """An ``untraced`` node is a gap: the call that made its tensor was not logged, so nothing
    can show the tensor is what the model computed, nor what it was computed from."""
    ok = True
    for entry in history:
        if entry.kind != "untraced":
            continue
        where = f" inside module '{entry.containing_module}'" if entry.containing_module else ""
        used_by = ", ".join(entry.child_layers) or "no logged layer"
        ok = report.fail(
            f"{entry.label}: untraced producer{where}, used by {used_by}: {entry.untraced_reason}, so "
            "what it was computed from is unknown. Call that computation through a torch function "
            "or a torch.library custom operator (both are logged), or report it to torchlens if "
            "it is a torch function.")
    return ok


def _check_replays(history: ModelHistory, report: _Report) -> bool:
    ok = True
    generator = torch.Generator().manual_seed(0)
    for entry in history:
        if entry.kind in ("input", "buffer") or entry.func is None or entry.func_name in UNCOMPARABLE:
            continue
        if entry.func_args is None and not entry.parent_layers:
            continue  # a pass-through of a tensor that is not a layer (e.g. a returned parameter)
        with torch.no_grad():
            result = _replay(entry, history, {})
        if isinstance(result, str):
            ok = report.fail(f"{entry.label}: re-running {entry.func_name} failed: {result}")
            continue
        if not _same(result, entry.activation):
            ok = report.fail(f"{entry.label}: re-running {entry.func_name} on the saved parents does not "
                             "reproduce the saved activation")
            continue
        if entry.activation.numel() == 0:
            continue  # an empty result cannot change
        for parent in entry.parent_layers:
            if not _exempt(entry, parent, history) and not _depends_on(entry, parent, history, generator):
                ok = report.fail(f"{entry.label}: changing parent {parent} does not change the result, "
                                 "so the recorded edge may not be a real dependency")
    return ok


def _depends_on(entry: TensorLogEntry, parent: str, history: ModelHistory, generator: torch.Generator) -> bool:
    """Some replacement of the parent's value changes the result (or the function rejects it).

    Any change counts, however small (a layer scale of 1e-6 shrinks it). If nothing changes,
    the other arguments may be hiding the dependency (zero-initialised weights, a zero
    residual branch): they are replaced by random values, and the parent perturbed again.
    """
    if _changes(entry, parent, history, generator, {}, None, entry.activation):
        return True
    others = {p: _random_like(history[p].activation, generator)
              for p in entry.parent_layers if p != parent and _is_float(history[p].activation)}
    constants = {id(t): _random_like(t, generator)
                 for t in _tensors(entry.func_args) + _tensors(entry.func_kwargs) if _is_float(t)}
    with torch.no_grad():
        reference = _replay(entry, history, others, constants)
    return isinstance(reference, str) or _changes(entry, parent, history, generator, others, constants, reference)


def _changes(entry, parent, history, generator, others, constants, reference) -> bool:
    for candidate in _perturbations(history[parent].activation, generator):
        with torch.no_grad():
            changed = _replay(entry, history, {**others, parent: candidate}, constants)
        if isinstance(changed, str) or not _identical(changed, reference):
            return True  # an error means the values matter too (e.g. an index out of range)
    return False


def _identical(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.is_nested != b.is_nested or a.layout != b.layout:
        return False
    parts_a, parts_b = _parts(a), _parts(b)
    return len(parts_a) == len(parts_b) and all(
        x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x, y)) for x, y in zip(parts_a, parts_b))


def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def _tensors(value: Any) -> List[torch.Tensor]:
    """Tensors (not parents) inside saved function arguments."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _exempt(entry: TensorLogEntry, parent: str, history: ModelHistory) -> bool:
    value = history[parent].activation
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return True  # indices and masks: perturbing them is not meaningful
    if value.numel() == 0:
        return True
    rule = PERTURBATION_EXEMPT.get(entry.func_name) or PERTURBATION_EXEMPT.get(entry.layer_type)
    if rule is None:
        return False
    positions = rule[0]
    return positions == "all" or any(p in positions for p in entry.parent_arg_positions.get(parent, ()))


def _perturbations(value: torch.Tensor, generator: torch.Generator):
    """Random noise, then large negative and large positive values: thresholds, signs and
    comparisons (``x.mean() > 0``) flip for at least one of them. Nested and sparse tensors are
    perturbed component by component and keep their kind."""
    parts = [p.detach() for p in _parts(value)]
    noises = []
    for part in parts:
        noise = torch.randn(part.shape, generator=generator, dtype=torch.float32).to(part.device)
        if part.is_complex():
            noise = noise * (1 + 1j)
        noises.append(noise.to(part.dtype))
    scale = max((float(p.abs().max()) for p in parts if p.numel()), default=0.0) + 1.0
    for make in (lambda p, n: p + n * scale, lambda p, n: -p.abs() - (n.abs() + 1) * scale,
                 lambda p, n: p.abs() + (n.abs() + 1) * scale):
        yield _from_parts(value, [make(p, n) for p, n in zip(parts, noises)])


def _replay(entry: TensorLogEntry, history: ModelHistory, overrides: Dict[str, torch.Tensor],
            constants: Optional[Dict[int, torch.Tensor]] = None) -> Any:
    """Run the entry's function on its parents' saved activations; an error message on failure.

    ``constants``: replacements for the other tensor arguments (parameters), by ``id``.
    """

    def value_of(ref: Any) -> Any:
        if isinstance(ref, ParentRef):
            saved = overrides.get(ref.label, history[ref.label].activation)
            return saved.clone()  # in-place replays must not change what was saved
        if constants is not None and isinstance(ref, torch.Tensor):
            return constants.get(id(ref), ref)
        return ref

    args = _resolve(entry.func_args if entry.func_args is not None else _parents_as_args(entry), value_of)
    kwargs = _resolve(entry.func_kwargs or {}, value_of)
    if kwargs.get("out") is not None:  # a fresh out= tensor per replay: results must not alias
        kwargs["out"] = replace_tensors(kwargs["out"], empty_out)
    if entry.rng_state is not None:
        cpu, cuda = entry.rng_state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
    try:
        out = entry.func(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported to the caller
        return f"{type(error).__name__}: {error}"
    if entry.is_inplace:
        out = kwargs.get("out") if kwargs.get("out") is not None else args[0]
    if entry.output_index is None:
        return out
    return dict(tensors_in(out)).get(entry.output_index)


def _parents_as_args(entry: TensorLogEntry) -> tuple:
    return tuple(ParentRef(p) for p in entry.parent_layers)


def _resolve(value: Any, value_of: Callable[[Any], Any]) -> Any:
    if isinstance(value, (ParentRef, torch.Tensor)):
        return value_of(value)
    if type(value) in (list, tuple):
        return type(value)(_resolve(v, value_of) for v in value)
    if type(value) is dict:
        return {k: _resolve(v, value_of) for k, v in value.items()}
    return value


__all__ = ["validate_model_activations", "PERTURBATION_EXEMPT"]
