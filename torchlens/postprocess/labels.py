"""Labels (``conv2d_3_7``, ``linear_1_1:2``) and the keys that find each entry."""
from __future__ import annotations

from typing import Dict, List, Tuple, Union

from ..history.tensor_log import TensorLogEntry

Key = Union[str, int]


class Ambiguous:
    """A key that names several entries (a layer's passes, or a module's several passes)."""

    __slots__ = ("what", "labels")

    def __init__(self, what: str, labels: List[str]) -> None:
        self.what = what
        self.labels = labels


def assign_labels(layers: List[List[TensorLogEntry]]) -> None:
    """``<type>_<k>_<n>``: k counts layers of the type, n counts layers overall (by first pass)."""
    type_counts: Dict[str, int] = {}
    for n, passes in enumerate(layers):
        layer_type = passes[0].layer_type
        k = type_counts[layer_type] = type_counts.get(layer_type, 0) + 1
        layer_label = f"{layer_type}_{k}_{n}"
        for pass_num, e in enumerate(passes, 1):
            e.type_index, e.layer_index = k, n
            e.pass_num, e.num_passes = pass_num, len(passes)
            e.layer_label = layer_label
            e.short_label = f"{layer_type}_{k}"
            e.label = layer_label if len(passes) == 1 else f"{layer_label}:{pass_num}"


def build_lookup(entries: List[TensorLogEntry], module_passes: Dict[str, int]) -> Dict[Key, object]:
    """Every key form of every entry -> the entry, or ``Ambiguous`` when a key names several.

    Also sets ``lookup_keys`` (what ``print(entry)`` lists) and the entries' ordinals.
    """
    lookup: Dict[Key, object] = {}
    shared: Dict[str, Tuple[str, List[str]]] = {}

    def add(key: Key, e: TensorLogEntry) -> None:
        lookup[key] = e

    def add_shared(key: str, what: str, e: TensorLogEntry) -> None:
        shared.setdefault(key, (what, []))[1].append(e.label)

    total = len(entries)
    for i, e in enumerate(entries):
        e.operation_num, e.num_operations = i, total
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
        for address, pass_num in e.output_of_modules:
            with_pass = f"{address}:{pass_num}"
            add_shared(with_pass, f"module {with_pass} has several output tensors", e)
            add_shared(address, f"module {address} has {module_passes.get(address, 1)} passes or outputs", e)
            keys.extend([address, with_pass] if module_passes.get(address, 1) == 1 else [with_pass])
        if e.address:
            add(e.address, e)
            keys.append(e.address)
        e.lookup_keys = _sorted_keys(keys)
    by_label = {e.label: e for e in entries}
    for key, (what, labels) in shared.items():
        if key in lookup:
            continue
        lookup[key] = by_label[labels[0]] if len(labels) == 1 else Ambiguous(what, labels)
    # a module key that names exactly one entry is listed without ambiguity
    for e in entries:
        e.lookup_keys = [k for k in e.lookup_keys if lookup.get(k) is e]
    return lookup


def _sorted_keys(keys: List[Key]) -> List[Key]:
    ints = sorted({k for k in keys if isinstance(k, int)})
    strs = sorted({k for k in keys if isinstance(k, str)})
    return ints + strs
