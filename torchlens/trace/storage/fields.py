"""What each field of a loaded layer may hold: a saved folder may have been edited or damaged, so
every decoded field is checked here, and one that is not what the tracer writes is a
``HistoryFileError`` naming the layer and the field (never a history that fails later, in
printing or lookup, with some other exception).

Fields that are not listed (a newer torchlens's) are accepted as they are.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

Check = Callable[[Any], bool]


def _int(v: Any) -> bool:
    return type(v) is int


def _count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _str(v: Any) -> bool:
    return type(v) is str


def _bool(v: Any) -> bool:
    return type(v) is bool


def _number(v: Any) -> bool:
    return type(v) in (int, float)


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _seq(check: Check) -> Check:
    return lambda v: type(v) in (list, tuple) and all(check(x) for x in v)


def _module_pass(v: Any) -> bool:
    return type(v) in (list, tuple) and len(v) == 2 and _str(v[0]) and _count(v[1])


def _position(v: Any, depth: int = 0) -> bool:
    if type(v) in (int, str):
        return True
    return depth < 8 and type(v) is tuple and all(_position(x, depth + 1) for x in v)


def _dict(key: Check, value: Check) -> Check:
    return lambda v: type(v) is dict and all(key(k) and value(x) for k, x in v.items())


def _size(v: Any) -> bool:
    return type(v) is torch.Size and all(n >= 0 for n in v)


def _any(v: Any) -> bool:
    return True


_KINDS = frozenset({"op", "input", "output", "buffer", "untraced"})

ENTRY_CHECKS: Dict[str, Check] = {
    "raw_index": _int,
    "func": lambda v: v is None or callable(v),
    "func_name": _str,
    "layer_type": _str,
    "kind": lambda v: v in _KINDS if type(v) is str else False,
    "address": _optional(_str),
    "parent_refs": lambda v: v == () or v == [],  # emptied after post-processing
    "param_addresses": _seq(_str),
    "module_stack": _seq(_module_pass),
    "elapsed": _number,
    "is_inplace": _bool,
    "output_index": _optional(_position),
    "shape": _optional(_size),
    "dtype": _optional(lambda v: isinstance(v, torch.dtype)),
    "nbytes": _optional(_count),
    "grad_fn_name": _optional(_str),
    "output_of_modules": _seq(_module_pass),
    "bool_used": _bool,
    "stored_as_buffer": _optional(_str),
    "untraced_reason": _optional(_str),
    "intervened": _optional(_str),
    "label": _str,
    "layer_label": _str,
    "short_label": _str,
    "type_index": _count,
    "layer_index": _count,
    "pass_num": _count,
    "num_passes": _count,
    "parent_layers": _seq(_str),
    "child_layers": _seq(_str),
    "parent_arg_positions": _dict(_str, _seq(_position)),
    "param_shapes": _seq(_size),
    "num_params": _count,
    "param_bytes": _count,
    "created_inside_model": _bool,
    "lookup_keys": _seq(lambda v: type(v) in (int, str)),
    "operation_num": _count,
    "num_operations": _count,
    "module_passes": _optional(_dict(_str, _count)),
    "module_output_positions": _optional(_dict(_module_pass, _any)),
    "call_outputs": _optional(_seq(_str)),
    "gradient_note": _optional(_str),
    "branch_condition": _optional(_str),
}


def _tagged(*tags: str) -> Check:
    return lambda v: v is None or (type(v) is dict and v.get("t") in tags)


# the fields read when first used: their JSON form is checked when loading, their value when read
# (an activation may be anything an ``activation_postfunc`` returned)
LAZY_JSON_CHECKS: Dict[str, Check] = {
    "activation": _any,
    "gradient": _tagged("tensor", "meta"),
    "func_args": lambda v: v is None or type(v) is list or _tagged("tuple")(v),
    "func_kwargs": _tagged("dict"),
    "rng_state": _tagged("tuple"),
}


def _rng_state(v: Any) -> bool:
    return (
        type(v) is tuple
        and len(v) == 2
        and isinstance(v[0], torch.Tensor)
        and (v[1] is None or (type(v[1]) in (list, tuple) and all(isinstance(t, torch.Tensor) for t in v[1])))
    )


LAZY_CHECKS: Dict[str, Check] = {
    "activation": _any,
    "gradient": _optional(lambda v: isinstance(v, torch.Tensor)),
    "func_args": _optional(lambda v: type(v) in (list, tuple)),
    "func_kwargs": _optional(lambda v: type(v) is dict),
    "rng_state": _optional(_rng_state),
}

# the history's own attributes (``vars(history)``) that loading and printing rely on
HISTORY_CHECKS: Dict[str, Check] = {
    "model_name": _str,
    "_all_labels": _seq(_str),
    "param_info": _dict(
        _str, lambda v: type(v) is tuple and len(v) == 3 and _size(v[0]) and _count(v[1]) and _count(v[2])
    ),
    "random_seed": _optional(_int),
    "pass_time": _optional(_number),
    "postprocess_time": _optional(_number),
    "notes": _seq(_str),
}


def modules_ok(modules: Any) -> bool:
    """``history.modules`` (a ``ModuleInfo``) holds what the tracer writes."""
    return (
        _seq(_str)(getattr(modules, "addresses", None))
        and _dict(_str, _str)(getattr(modules, "types", None))
        and _dict(_str, _seq(_str))(getattr(modules, "children", None))
        and _dict(_str, _count)(getattr(modules, "passes", None))
    )


def pass_stats_ok(stats: Any) -> bool:
    """``history.pass_stats`` (a ``PassStats``) holds what the tracer writes."""
    names = ("num_tensors", "tensor_bytes", "num_param_operations", "max_passes")
    return all(_count(getattr(stats, n, None)) for n in names) and all(
        _bool(getattr(stats, n, None)) for n in ("is_branching", "has_conditional_branching")
    )


def call_frames_ok(frames: Any, num_codes: int) -> bool:
    """``[[code number, line, offset], ...]`` with code numbers into the code table."""
    return type(frames) is list and all(
        type(f) is list
        and len(f) == 3
        and _count(f[0])
        and f[0] < num_codes
        and _optional(_int)(f[1])
        and _optional(_int)(f[2])
        for f in frames
    )


__all__ = [
    "ENTRY_CHECKS",
    "HISTORY_CHECKS",
    "LAZY_CHECKS",
    "LAZY_JSON_CHECKS",
    "modules_ok",
    "pass_stats_ok",
    "call_frames_ok",
]
