"""The history's lookup index: every key that finds an entry (a label, ``'linear_1_1:2'``, a module
address, ``'lstm:1.0'``, an ordinal), built when the history is first looked up by key (or when
it is loaded)."""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

from ..records.position import Position
from ..records.tensor_log import TensorLogEntry

Key = Union[str, int]


class Ambiguous:
    """A key that names several entries (a layer's passes, a module's passes or outputs), with
    more specific keys that each name one of them (``suggestions``: found when first read, as
    only an error message reads them; a recurrent layer of 1,000 passes has 1,000)."""

    __slots__ = ("what", "labels", "_suggestions", "_suggest")

    def __init__(
        self,
        what: str,
        labels: List[str],
        suggestions: Optional[Sequence[Key]] = None,
        suggest: Optional[Callable[[], List[Key]]] = None,
    ) -> None:
        self.what = what
        self.labels = labels
        self._suggestions = list(suggestions) if suggestions is not None else None
        self._suggest = suggest

    @property
    def suggestions(self) -> List[Key]:
        if self._suggestions is None:
            self._suggestions = self._suggest() if self._suggest is not None else []
            self._suggest = None
        return self._suggestions

    def __reduce__(self) -> Tuple[Type[Ambiguous], Tuple[str, List[str], List[Key]]]:
        return Ambiguous, (self.what, self.labels, self.suggestions)


Found = Union[TensorLogEntry, Ambiguous]  # what a key names


def output_key(address: str, pass_num: int, position: Position) -> str:
    """The key of one output of one module call: ``'lstm:1.0'`` (first output of the first call),
    ``'lstm:1.1.0'`` (``output[1][0]``), ``'block:2.hidden'`` (a dict's ``'hidden'``)."""
    path = position if isinstance(position, tuple) else (position,)
    return f"{address}:{pass_num}." + ".".join(map(str, path))


class Lookup(Dict[Key, Found]):
    """The key index of a history. A plain dict that can be referred to weakly: an ``Ambiguous``
    finds its suggestions in it when first asked, without holding it (which would make the whole
    history a reference cycle, freed only by the garbage collector's slow full passes instead of
    the moment it is dropped)."""

    __slots__ = ("__weakref__",)


def build_lookup(entries: List[TensorLogEntry], module_passes: Dict[str, int]) -> Lookup:
    """Every key form of every entry -> the entry, or ``Ambiguous`` when a key names several.

    Also sets ``lookup_keys`` (what ``print(entry)`` lists); ordinals index ``entries``.
    """
    lookup = Lookup()
    # key -> (what it names, as _what's arguments; its labels as an ordered set: a module may
    # return a tensor twice). Most keys name one entry: their message is never made.
    shared: Shared = {}
    # per entry: the names it was given (its places in module outputs among them)
    given: List[List[str]] = []

    # inlined dict stores and f-strings: this runs for every entry of every pass (decode steps)
    total = len(entries)
    for i, e in enumerate(entries):
        e.module_passes = module_passes
        label, layer_label, short_label, pass_num = e.label, e.layer_label, e.short_label, e.pass_num
        keys: List[str] = [label]
        lookup[i] = e
        lookup[i - total] = e
        lookup[label] = e
        layer_pass = f"{layer_label}:{pass_num}"
        lookup[layer_pass] = e
        lookup[f"{short_label}:{pass_num}"] = e
        if e.num_passes == 1:
            keys.append(layer_pass)
            lookup[layer_label] = e
            lookup[short_label] = e
        else:
            _share(shared, layer_label, ("layer", layer_label, e.num_passes), label)
            _share(shared, short_label, ("layer", layer_label, e.num_passes), label)
        if e.module_output_positions:
            for (address, module_pass), position in e.module_output_positions.items():
                if position != ():
                    out_key = output_key(address, module_pass, position)
                    lookup[out_key] = e
                    keys.append(out_key)
        for address, module_pass in e.output_of_modules:
            with_pass = f"{address}:{module_pass}"
            passes = module_passes.get(address, 1)
            _share(shared, with_pass, ("call", with_pass), label)
            _share(shared, address, ("module", address, passes), label)
            if passes == 1:
                keys.append(address)
            keys.append(with_pass)
        if e.address:
            lookup[e.address] = e
            keys.append(e.address)
        given.append(keys)
    by_label = {e.label: e for e in entries}
    for shared_key, (what, labels) in shared.items():
        if shared_key in lookup:
            continue
        if len(labels) == 1:
            lookup[shared_key] = by_label[next(iter(labels))]
        else:
            suggest = functools.partial(
                _specific_keys, weakref.ref(lookup), by_label, key=shared_key, labels=list(labels)
            )
            lookup[shared_key] = Ambiguous(_what(*what), list(labels), suggest=suggest)
    get = lookup.get
    for i, (e, names) in enumerate(zip(entries, given)):
        # the two ordinals (only this entry's) first, then the names it alone answers to, sorted
        names.sort()
        found: List[Key] = [i - total, i]
        previous = None
        for k in names:  # sorted: a name given twice is next to itself
            if k != previous and get(k) is e:
                found.append(k)
            previous = k
        e.lookup_keys = found
    return lookup


def keep_keys(state: Dict[str, Any], name: str, module_passes: Dict[str, int]) -> None:
    """A history dies whose index was never built (``state``: its attributes; ``state[name]``:
    its entries): if anything still holds one of its entries, or their list, each entry gets its
    ``lookup_keys`` now, while the others are at hand.

    A history makes no reference cycle, so it dies as its last reference goes; its list then
    holds its entries alone unless something else does. Reference counts tell, in C: each is
    compared with that of an object nothing else holds, read the same way (so the comparison
    means the same on every Python version)."""
    state.pop("_rolled", None)  # the rolled view refers to entries too
    entries = state.pop(name)
    alone: List[TensorLogEntry] = []
    list_held = sys.getrefcount(entries) > sys.getrefcount(alone)
    entry_held = max(map(sys.getrefcount, entries), default=0) > next(map(sys.getrefcount, [object()]))
    if list_held or entry_held:
        build_lookup(entries, module_passes)


Shared = Dict[str, Tuple[Tuple[Any, ...], Dict[str, None]]]


def _share(shared: Shared, key: str, what: Tuple[Any, ...], label: str) -> None:
    """``key`` names the entry ``label`` among others maybe; ``what``: the first naming's
    ``_what`` arguments."""
    held = shared.get(key)
    if held is None:
        held = shared[key] = (what, {})
    held[1][label] = None


def _what(kind: str, name: str, passes: int = 1) -> str:
    """What an ambiguous key names (its message is made only for the keys that are)."""
    if kind == "layer":
        return f"layer {name} has {passes} passes"
    if kind == "call":
        return f"module call {name} returned several tensors"
    if passes > 1:
        return f"module {name} has {passes} passes"
    return f"module {name} returned several tensors"


def _specific_keys(
    lookup_ref: "weakref.ref[Lookup]", by_label: Dict[str, TensorLogEntry], key: Key, labels: List[str]
) -> List[Key]:
    lookup = lookup_ref()
    if lookup is None:  # the history is gone: its labels are the specific keys
        return list(labels)
    return [_specific_key(lookup, by_label[label], key) for label in labels]


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


__all__ = ["Ambiguous", "Found", "Key", "Lookup", "build_lookup", "keep_keys", "output_key"]
