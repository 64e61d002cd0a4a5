"""Checks of the public functions' arguments, each a line where the argument enters: a bad value
is refused at once, by an error that names the argument, what it got and what it takes, instead
of a bare ``TypeError`` from deep inside torch (or a pass that fails half-way).

The errors keep their built-in bases, so ``except TypeError`` / ``except ValueError`` still work.

Example:
    >>> from torchlens.arguments import require_int
    >>> require_int("port", True, "tl.watch", minimum=0, maximum=65535)
    Traceback (most recent call last):
    ...
    torchlens.arguments.ArgumentTypeError: tl.watch: port takes an int in 0..65535, not True (bool).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable, Collection, Dict, Optional, Tuple, Union

from .errors import TorchlensError


class ArgumentTypeError(TorchlensError, TypeError):
    """An argument of a type the function does not take."""


class ArgumentValueError(TorchlensError, ValueError):
    """An argument of the right type whose value the function does not take."""


class MissingPathError(TorchlensError, FileNotFoundError):
    """A path argument that names nothing."""


class PathExistsError(TorchlensError, FileExistsError):
    """A path argument that names something torchlens will not replace."""


class PathNotWritableError(TorchlensError, PermissionError):
    """A path argument where torchlens may not write."""


def describe(value: Any) -> str:
    """``True (bool)``, ``'x' (str)``: a short, printable account of what was passed."""
    text = ascii(value) if isinstance(value, (str, bytes)) else repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    text = "".join(c if c.isprintable() else "?" for c in text)
    return f"{text} ({type(value).__name__})"


def refuse_type(caller: str, name: str, value: Any, takes: str) -> ArgumentTypeError:
    """The error for a value of the wrong type (to raise), for checks the helpers below lack."""
    return ArgumentTypeError(f"{caller}: {name} takes {takes}, not {describe(value)}.")


def refuse_value(caller: str, name: str, value: Any, takes: str) -> ArgumentValueError:
    """The error for a value outside what the argument takes (to raise)."""
    return ArgumentValueError(f"{caller}: {name} takes {takes}, not {describe(value)}.")


def require_bool(name: str, value: Any, caller: str, optional: bool = False) -> Optional[bool]:
    """``True`` or ``False`` (a numpy bool too); ``None`` only when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise refuse_type(caller, name, value, "True or False" + (" (or None)" if optional else ""))


def _range_text(minimum: Optional[float], maximum: Optional[float]) -> str:
    if minimum is not None and maximum is not None:
        return f" in {minimum}..{maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def require_int(
    name: str,
    value: Any,
    caller: str,
    *,
    minimum: Optional[int] = None,
    maximum: Optional[int] = None,
    optional: bool = False,
) -> Optional[int]:
    """An int (a numpy integer too, never a bool or a float) within ``minimum``..``maximum``."""
    if value is None and optional:
        return None
    takes = f"an int{_range_text(minimum, maximum)}" + (" (or None)" if optional else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refuse_type(caller, name, value, takes)
    number = int(value)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise refuse_value(caller, name, value, takes)
    return number


def require_float(
    name: str,
    value: Any,
    caller: str,
    *,
    minimum: Optional[float] = None,
    below: Optional[float] = None,
    optional: bool = False,
) -> Optional[float]:
    """A finite real number (not a bool) ``>= minimum`` and ``< below``."""
    if value is None and optional:
        return None
    takes = "a finite number"
    if minimum is not None:
        takes += f" >= {minimum}"
    if below is not None:
        takes += f"{' and' if minimum is not None else ''} < {below}"
    takes += " (or None)" if optional else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise refuse_type(caller, name, value, takes)
    number = float(value)
    if (
        not math.isfinite(number)
        or (minimum is not None and number < minimum)
        or (below is not None and number >= below)
    ):
        raise refuse_value(caller, name, value, takes)
    return number


def require_str(name: str, value: Any, caller: str, optional: bool = False) -> Optional[str]:
    """A non-empty string."""
    if value is None and optional:
        return None
    takes = "a non-empty string" + (" (or None)" if optional else "")
    if not isinstance(value, str):
        raise refuse_type(caller, name, value, takes)
    if not value:
        raise refuse_value(caller, name, value, takes)
    return value


def require_choice(name: str, value: Any, caller: str, choices: Collection[Any]) -> Any:
    """One of ``choices`` (compared by equality; ``None`` only when it is a choice)."""
    shown = ", ".join(repr(c) for c in choices)
    try:
        known = bool(value in choices)
    except Exception:  # an unhashable value asked of a set, a tensor's elementwise ==
        known = False
    # True == 1: a bool is a choice only when the choices hold that very bool
    if known and (not isinstance(value, bool) or any(c is value for c in choices)):
        return value
    kind = refuse_value if isinstance(value, str) or value is None else refuse_type
    raise kind(caller, name, value, f"one of {shown}")


def require_choices(name: str, value: Any, caller: str, choices: Collection[str]) -> Tuple[str, ...]:
    """One name of ``choices`` or an iterable of them (a list, a tuple, a set), at least one."""
    shown = ", ".join(repr(c) for c in choices)
    takes = f"one of {shown}, or a list of them"
    if isinstance(value, str):
        items: Tuple[Any, ...] = (value,)
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = tuple(value)
    else:
        raise refuse_type(caller, name, value, takes)
    unknown = [v for v in items if not isinstance(v, str) or v not in choices]
    if not items or unknown:
        named = f" ({', '.join(map(repr, unknown))} unknown)" if unknown and len(items) > 1 else ""
        raise ArgumentValueError(f"{caller}: {name} takes {takes}, not {describe(value)}{named}.")
    return items


def require_callable(name: str, value: Any, caller: str, optional: bool = False) -> Optional[Callable[..., Any]]:
    """A function (or any callable object)."""
    if value is None and optional:
        return None
    if callable(value) and not isinstance(value, type):
        return value
    raise refuse_type(caller, name, value, "a function" + (" (or None)" if optional else ""))


def require_path(name: str, value: Any, caller: str, exists: bool = False, new: bool = False) -> str:
    """A path: a non-empty ``str`` or ``os.PathLike`` of one, without NUL bytes; ``exists``: it
    must be there (a missing one is a ``FileNotFoundError`` of torchlens); ``new``: where it is
    missing, the nearest folder above it that exists is a folder (so it can be made)."""
    takes = "a path (a str or pathlib.Path)"
    if not isinstance(value, (str, os.PathLike)):
        raise refuse_type(caller, name, value, takes)
    path = os.fspath(value)
    if not isinstance(path, str):
        raise refuse_type(caller, name, value, takes)
    if not path or "\0" in path:
        raise refuse_value(caller, name, value, takes)
    if exists and not os.path.exists(path):
        raise MissingPathError(f"{caller}: {name} {path!r}: no such folder or file.")
    if new and not os.path.exists(path):
        above = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if not os.path.isdir(above):
            raise refuse_value(caller, name, value, f"a path that can be created ({above} is a file, not a folder)")
    return path


def require_instance(name: str, value: Any, caller: str, kinds: Union[type, Tuple[type, ...]], *, takes: str) -> Any:
    """An instance of ``kinds`` (``takes`` says it in words: 'a ModelHistory')."""
    if isinstance(value, kinds):
        return value
    raise refuse_type(caller, name, value, takes)


def require_device(name: str, value: Any, caller: str, optional: bool = False) -> Any:
    """A device torch can name: ``'cpu'``, ``'cuda:0'``, a ``torch.device`` (not a bare int)."""
    if value is None and optional:
        return None
    import torch

    takes = "a device such as 'cpu' or 'cuda:0' (a str or torch.device)" + (" (or None)" if optional else "")
    if not isinstance(value, (str, torch.device)):
        raise refuse_type(caller, name, value, takes)
    try:
        return torch.device(value)
    except (RuntimeError, ValueError):
        raise refuse_value(caller, name, value, takes) from None


def _flag(name: str, value: Any, caller: str) -> Any:
    return require_bool(name, value, caller)


def _optional_flag(name: str, value: Any, caller: str) -> Any:
    return require_bool(name, value, caller, optional=True)


def _seed(name: str, value: Any, caller: str) -> Any:
    return require_int(name, value, caller, minimum=0, maximum=2**64 - 1, optional=True)


def _function(name: str, value: Any, caller: str) -> Any:
    return require_callable(name, value, caller, optional=True)


def _folder(name: str, value: Any, caller: str) -> Any:
    return None if value is None else require_path(name, value, caller, new=True)


def _depth(name: str, value: Any, caller: str) -> Any:
    return require_int(name, value, caller, minimum=0, optional=True)


def _tolerance(name: str, value: Any, caller: str) -> Any:
    return require_float(name, value, caller, minimum=0.0, optional=True)


def _dim(name: str, value: Any, caller: str) -> Any:
    return require_int(name, value, caller)


def _count(name: str, value: Any, caller: str) -> Any:
    return require_int(name, value, caller, minimum=1, maximum=2**63 - 1, optional=True)


def _output_device(name: str, value: Any, caller: str) -> Any:
    return value if value in ("same", None) else require_device(name, value, caller)


def _fileformat(name: str, value: Any, caller: str) -> Any:
    if value is None:
        return None
    import graphviz  # a dependency; loaded only when a format is checked

    if not isinstance(value, str):
        raise refuse_type(caller, name, value, "a graphviz output format such as 'pdf', 'png' or 'svg'")
    if value not in graphviz.FORMATS:
        raise refuse_value(caller, name, value, "a graphviz output format such as 'pdf', 'png' or 'svg'")
    return value


# The options several public functions share, each with one rule wherever it appears.
_FLAGS = (
    "detach_saved_tensors save_function_args save_gradients verbose backward training replay verify "
    "reuse_structure overwrite inline_single_op_modules disable_inplace delay_log_multibackward "
    "manual_steps input_grads durable"
)
RULES: Dict[str, Callable[[str, Any, str], Any]] = {
    **{flag: _flag for flag in _FLAGS.split()},
    **{flag: _optional_flag for flag in ("keep_unsaved_layers", "vis_save_only", "progress", "show_gradients")},
    **{name: _function for name in ("activation_postfunc", "loss_fn", "metric")},
    **{name: _folder for name in ("save_to", "vis_outpath")},
    "random_seed": _seed,
    "position_dim": _dim,
    "n_heads": _count,
    "rtol": _tolerance,
    "atol": _tolerance,
    "vis_nesting_depth": _depth,
    "vis_fileformat": _fileformat,
    "output_device": _output_device,
}


def check(caller: str, **values: Any) -> None:
    """Check each argument by the rule of its name (``RULES``), in one call at an entry point.

    Example:
        >>> check("log_forward_pass", save_gradients="yes")
        Traceback (most recent call last):
        ...
        torchlens.arguments.ArgumentTypeError: log_forward_pass: save_gradients takes True or False, not 'yes' (str).
    """
    for name, value in values.items():
        RULES[name](name, value, caller)


def check_arguments(caller: str, arguments: Dict[str, Any]) -> None:
    """Check every argument of ``arguments`` (an entry point's ``locals()``, taken first thing)
    whose name has a rule; the others are the entry point's own to check."""
    for name, value in arguments.items():
        rule = RULES.get(name)
        if rule is not None:
            rule(name, value, caller)


__all__ = [
    "check",
    "check_arguments",
    "require_device",
    "ArgumentTypeError",
    "ArgumentValueError",
    "MissingPathError",
    "PathExistsError",
    "PathNotWritableError",
    "describe",
    "refuse_type",
    "refuse_value",
    "require_bool",
    "require_int",
    "require_float",
    "require_str",
    "require_choice",
    "require_choices",
    "require_callable",
    "require_path",
    "require_instance",
]
