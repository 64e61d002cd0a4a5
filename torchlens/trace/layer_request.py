"""``layers_to_save``: parsing a request, and deciding whether one pass can satisfy it.

A request is resolvable *during* the pass when every key is a module address (saved when the
module returns), an input, output or buffer address (``'input.x'``, ``'output.logits'``,
``'bn.running_mean'``: any other key with a ``.``, or a buffer's name; known when the tensor is
recorded) or a substring of layer types (``'conv'``, ``'linear'``): a string without ``_`` or
``:`` that is not all digits can only match inside the type part of a label. Keys that need
final labels or ordinals (``'conv2d_3_7'``, ``-5``) need a first, metadata-only pass, as does
a module address that is also an output address (``self.output = nn.Linear(...)``): the lookup
decides, as it does for ``history['output']``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Collection, FrozenSet, List, Set, Tuple, Union

from ..arguments import ArgumentTypeError, ArgumentValueError, describe
from .history.index import Ambiguous
from .history.model_history import ModelHistory, as_key
from .records.tensor_log import TensorLogEntry

LayerKey = Union[str, int]


@dataclass
class LayerRequest:
    save_all: bool = False
    keys: List[LayerKey] = field(default_factory=list)
    type_substrings: Tuple[str, ...] = ()
    modules: FrozenSet[Union[str, Tuple[str, int]]] = frozenset()
    addresses: FrozenSet[str] = frozenset()  # input, output and buffer addresses
    needs_labels: bool = False  # some key needs a metadata pass first

    @property
    def saves_nothing(self) -> bool:
        return not self.save_all and not self.keys


_TAKES = "'all', 'none', or a list of layer labels, module addresses, label substrings or positions"


def parse_request(
    layers_to_save: Any, module_addresses: Collection[str], buffer_addresses: Collection[str] = ()
) -> LayerRequest:
    """Classify each key of ``layers_to_save`` (see the module docstring)."""
    if isinstance(layers_to_save, str) and layers_to_save == "all":
        return LayerRequest(save_all=True)
    if layers_to_save is None or (isinstance(layers_to_save, str) and layers_to_save == "none"):
        return LayerRequest()
    if isinstance(layers_to_save, Mapping):  # a dict's values would mean nothing
        raise ArgumentTypeError(f"layers_to_save takes {_TAKES}, not {describe(layers_to_save)}.")
    keys = (
        [layers_to_save]
        if isinstance(layers_to_save, str) or not hasattr(layers_to_save, "__iter__")
        else list(layers_to_save)
    )
    substrings: List[str] = []
    modules: Set[Union[str, Tuple[str, int]]] = set()
    addresses: Set[str] = set()
    needs_labels = False
    for i, key in enumerate(keys):
        try:
            key = keys[i] = as_key(key)  # numpy integers are positions too
        except TypeError:
            raise ArgumentTypeError(
                f"layers_to_save entries must be layer labels, module addresses, substrings or ints; got {key!r}"
            ) from None
        if key == "":  # a substring of every label: surely not what was meant
            raise ArgumentValueError(f"layers_to_save takes {_TAKES}, not {describe(layers_to_save)}.")
        if isinstance(key, int):
            needs_labels = True
            continue
        base, sep, pass_text = key.rpartition(":")
        if key in module_addresses and key and (key == "output" or key.startswith("output.")):
            needs_labels = True  # also the model output's address: resolved as history[key] would be
        elif key in module_addresses and key:
            modules.add(key)
        elif sep and base in module_addresses and pass_text.isdigit():
            modules.add((base, int(pass_text)))
        elif sep and base in module_addresses and pass_text.partition(".")[0].isdigit():
            needs_labels = True  # one output of a module call ('lstm:1.0'): found by key after a first pass
        elif "." in key or key in buffer_addresses:
            addresses.add(key)  # labels and layer types have no '.': an input/output/buffer address
        elif "_" in key or ":" in key or key.isdigit():
            needs_labels = True
        else:
            substrings.append(key.lower())
    return LayerRequest(
        False, keys, tuple(substrings), frozenset(modules), addresses=frozenset(addresses), needs_labels=needs_labels
    )


def resolve_request(request: LayerRequest, history: ModelHistory) -> Set[int]:
    """Raw (execution-order) indices of the entries a request names; unknown keys raise."""
    chosen: Set[int] = set()
    for key in request.keys:
        chosen.update(e.raw_index for e in entries_for_key(history, key))
    return chosen


def entries_for_key(history: ModelHistory, key: LayerKey, option: str = "layers_to_save") -> List[TensorLogEntry]:
    """Entries a ``layers_to_save`` key selects: exact key (all passes of a layer or module),
    else every layer whose label contains the key. ``option`` names the argument in errors."""
    if isinstance(key, int):
        if not -len(history) <= key < len(history):
            raise ArgumentValueError(f"{option}: position {key} is out of range; the model has {len(history)} layers.")
        return [history[key]]
    found = history.lookup_value(key)
    if isinstance(found, TensorLogEntry):
        return [found]
    if isinstance(found, Ambiguous):
        return [history[label] for label in found.labels]
    matches = [e for e in history if key.lower() in e.label]
    if matches:
        return matches
    candidates = history.lookup_keys()
    close = difflib.get_close_matches(key, candidates, n=5, cutoff=0.5)
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise ArgumentValueError(f"{option}: {key!r} matches no layer label, module address or substring of a label.{hint}")
