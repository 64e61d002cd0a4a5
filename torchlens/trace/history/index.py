"""The history's lookup index: every key that finds an entry (a label, ``'linear_1_1:2'``, a module
address, ``'lstm:1.0'``, an ordinal), built once when the history is made or loaded."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple, Union

from ..records.tensor_log import TensorLogEntry

Key = Union[str, int]


class Ambiguous:
    """A key that names several entries (a layer's passes, a module's passes or outputs), with
    more specific keys that each name one of them."""

    __slots__ = ("what", "labels", "suggestions")

    def __init__(self, what: str, labels: List[str], suggestions: Sequence[Key] = ()) -> None:
        self.what = what
        self.labels = labels
        self.suggestions = list(suggestions)


Found = Union[TensorLogEntry, Ambiguous]  # what a key names


def output_key(address: str, pass_num: int, position: Any) -> str:
    """The key of one output of one module call: ``'lstm:1.0'`` (first output of the first call),
    ``'lstm:1.1.0'`` (``output[1][0]``), ``'block:2.hidden'`` (a dict's ``'hidden'``)."""
    path = position if isinstance(position, tuple) else (position,)
    return f"{address}:{pass_num}." + ".".join(map(str, path))


def build_lookup(entries: List[TensorLogEntry], module_passes: Dict[str, int]) -> Dict[Key, Found]:
    """Every key form of every entry -> the entry, or ``Ambiguous`` when a key names several.

    Also sets ``lookup_keys`` (what ``print(entry)`` lists); ordinals index ``entries``.
    """
    lookup: Dict[Key, Found] = {}
    # key -> (what it names, its labels as an ordered set: a module may return a tensor twice)
    shared: Dict[str, Tuple[str, Dict[str, None]]] = {}

    def add(key: Key, e: TensorLogEntry) -> None:
        lookup[key] = e

    def add_shared(key: str, what: str, e: TensorLogEntry) -> None:
        shared.setdefault(key, (what, {}))[1][e.label] = None

    total = len(entries)
    for i, e in enumerate(entries):
        e.module_passes = module_passes
        keys: List[Key] = [i - total, i, e.label]
        add(i, e)
        add(i - total, e)
        add(e.label, e)
        add(f"{e.layer_label}:{e.pass_num}", e)
        add(f"{e.short_label}:{e.pass_num}", e)
        if e.num_passes == 1:
            keys.append(f"{e.layer_label}:1")
            add(e.layer_label, e)
            add(e.short_label, e)
        else:
            add_shared(e.layer_label, f"layer {e.layer_label} has {e.num_passes} passes", e)
            add_shared(e.short_label, f"layer {e.layer_label} has {e.num_passes} passes", e)
        for (address, pass_num), position in (e.module_output_positions or {}).items():
            if position != ():
                add(output_key(address, pass_num, position), e)
        for address, pass_num in e.output_of_modules:
            with_pass = f"{address}:{pass_num}"
            passes = module_passes.get(address, 1)
            add_shared(with_pass, f"module call {with_pass} returned several tensors", e)
            add_shared(
                address,
                f"module {address} has {passes} passes" if passes > 1 else f"module {address} returned several tensors",
                e,
            )
            keys.extend([address, with_pass] if passes == 1 else [with_pass])
        if e.address:
            add(e.address, e)
            keys.append(e.address)
        e.lookup_keys = keys
    by_label = {e.label: e for e in entries}
    for shared_key, (what, labels) in shared.items():
        if shared_key in lookup:
            continue
        lookup[shared_key] = by_label[next(iter(labels))] if len(labels) == 1 else Ambiguous(what, list(labels))
    for key, found in lookup.items():
        if isinstance(found, Ambiguous):
            found.suggestions = [_specific_key(lookup, by_label[label], key) for label in found.labels]
    for e in entries:
        module_keys = [output_key(a, p, pos) for (a, p), pos in (e.module_output_positions or {}).items() if pos != ()]
        e.lookup_keys = [k for k in _sorted_keys(e.lookup_keys + module_keys) if lookup.get(k) is e]
    return lookup


def _specific_key(lookup: Dict[Key, Found], e: TensorLogEntry, key: Key) -> Key:
    """A key that names ``e`` alone, as close to the ambiguous ``key`` as possible: the module
    call (``'fc:2'``), one output of it (``'lstm:1.0'``), else the label (``'linear_1_1:2'``)."""
    address = key.split(":")[0] if isinstance(key, str) else None
    candidates: List[Key] = []
    for (a, pass_num), position in (e.module_output_positions or {}).items():
        if a == address:
            candidates.append(f"{a}:{pass_num}")
            if position != ():
                candidates.append(output_key(a, pass_num, position))
    candidates.append(e.label)
    return next(k for k in candidates if lookup.get(k) is e)


def _sorted_keys(keys: List[Key]) -> List[Key]:
    ints = sorted({k for k in keys if isinstance(k, int)})
    strs = sorted({k for k in keys if isinstance(k, str)})
    return ints + strs


__all__ = ["Ambiguous", "Found", "Key", "build_lookup", "output_key"]
