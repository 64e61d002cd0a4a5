"""Pickling and deep-copying a ``ModelHistory``.

A history holds what plain pickle refuses: Python code objects (every entry's ``call_frames``,
kept as they are during the pass because reading source there would slow it), activations with
an autograd graph (``copy.deepcopy`` refuses non-leaf tensors), and, for a loaded history, open
tensor files. ``ModelHistory.__reduce_ex__`` therefore pickles its state with ``HistoryPickler``,
into bytes, at pickling time only:

- a code object becomes a ``DetachedCode`` (records/func_call.py): file, function, first line and the source text of
  the function (``func_call_stack`` reads it, so source stays readable where the file is not);
- an entry of a loaded history becomes a plain ``TensorLogEntry`` with every field read now;
- tensors are pickled by torch (their values; an autograd graph is not kept).

``copy.deepcopy`` goes through the same path, so a deep copy is a pickled-and-unpickled history.

Example:
    >>> import pickle, torch, torchlens as tl
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2))
    >>> again = pickle.loads(pickle.dumps(h))
    >>> again.layer_labels == h.layer_labels, again['linear_1_1'].func_call_stack[-1].function
    (True, 'forward')
"""

from __future__ import annotations

import dis
import io
import linecache
import pickle
import types
from typing import Callable, Dict, Tuple, Type, Union

from ..records.func_call import DetachedCode
from ..records.tensor_log import _CAPTURE_FIELDS, _DERIVED_FIELDS, TensorLogEntry

SOURCE_CONTEXT = 10  # lines kept on each side of a function's own lines
_DROPPED = ("_rolled", "_store")  # derived again on use / open files of a loaded history
_ENTRY_FIELDS = _CAPTURE_FIELDS + _DERIVED_FIELDS


def _detached(code: types.CodeType) -> Tuple[Type[DetachedCode], Tuple[str, str, str, int, Dict[int, str]]]:
    """The pickle reduction of ``code`` to a ``DetachedCode`` (its source read now)."""
    numbers = [line for _, line in dis.findlinestarts(code) if line is not None] or [code.co_firstlineno]
    first = max(1, min(numbers + [code.co_firstlineno]) - SOURCE_CONTEXT)
    source: Dict[int, str] = {}
    for n in range(first, max(numbers) + SOURCE_CONTEXT + 1):
        text = linecache.getline(code.co_filename, n)
        if text:
            source[n] = text
    qualname = getattr(code, "co_qualname", code.co_name)  # Python >= 3.11
    return DetachedCode, (code.co_filename, code.co_name, qualname, code.co_firstlineno, source)


# What ``reducer_override`` gives pickle: (make, args) or (make, args, state)
_Reduced = Union[
    Tuple[Callable[..., object], Tuple[object, ...]], Tuple[Callable[..., object], Tuple[object, ...], object]
]


class HistoryPickler(pickle.Pickler):
    """A pickler for a history's state: code objects and lazily loaded entries get stand-ins."""

    def reducer_override(self, obj: object) -> _Reduced:
        if type(obj) is types.CodeType:
            return _detached(obj)
        if isinstance(obj, TensorLogEntry):
            # its fields, read now (a loaded entry reads its tensors from open files), without
            # the weak reference to its history (the history's state is pickled beside it)
            fields = {name: getattr(obj, name) for name in _ENTRY_FIELDS}
            return _blank_entry, (), (None, fields)
        return NotImplemented  # type: ignore[no-any-return]  # typeshed types NotImplemented as Any


def _blank_entry() -> TensorLogEntry:
    e = TensorLogEntry.__new__(TensorLogEntry)  # its fields are set from the pickled state
    e._history = None
    return e


def dumps_history(history: object) -> bytes:
    """The state of ``history`` as bytes that ``loads_history`` turns back into a history."""
    state = {k: v for k, v in history.__dict__.items() if k not in _DROPPED}
    buffer = io.BytesIO()
    HistoryPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((type(history), state))
    return buffer.getvalue()


def loads_history(data: bytes) -> object:
    """The history ``dumps_history`` wrote (the function pickle calls when unpickling one)."""
    cls, state = pickle.loads(data)  # noqa: S301 - the bytes of a history being unpickled anyway
    state["_rolled"] = None  # derived again on use
    history: object = cls.__new__(cls)
    history.__dict__.update(state)
    return history


__all__ = ["HistoryPickler", "dumps_history", "loads_history"]
