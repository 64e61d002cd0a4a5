"""Labels (``conv2d_3_7``, ``linear_1_1:2``) and the outputs of one call; the keys that find
each entry are the history's own index (``history/index.py``)."""

from __future__ import annotations

from typing import Dict, List

from ..records.tensor_log import TensorLogEntry


def assign_labels(layers: List[List[TensorLogEntry]]) -> None:
    """``<type>_<k>_<n>``: k counts layers of the type, n counts layers overall (by first pass)."""
    type_counts: Dict[str, int] = {}
    for n, passes in enumerate(layers):
        layer_type = passes[0].layer_type
        k = type_counts[layer_type] = type_counts.get(layer_type, 0) + 1
        layer_label = f"{layer_type}_{k}_{n}"
        short_label = f"{layer_type}_{k}"
        total = len(passes)
        if total == 1:  # most layers: no pass suffix, no loop
            e = passes[0]
            e.type_index = k
            e.layer_index = n
            e.pass_num = e.num_passes = 1
            e.layer_label = e.label = layer_label
            e.short_label = short_label
            continue
        for pass_num, e in enumerate(passes, 1):
            e.type_index = k
            e.layer_index = n
            e.pass_num = pass_num
            e.num_passes = total
            e.layer_label = layer_label
            e.short_label = short_label
            e.label = f"{layer_label}:{pass_num}"


def link_call_outputs(records: List[TensorLogEntry], kept: List[TensorLogEntry]) -> None:
    """The outputs of one call of a multi-output function (``torch.lstm`` -> output, h, c;
    ``torch.max(x, 1)`` -> values, indices) learn about each other: ``call_outputs`` lists
    their labels, so printing and drawing can say they come from one call.

    The tracer records a call's outputs one after the other, with the same function and the same
    call stack, each at a different ``output_index``.
    """
    alive = {id(e) for e in kept}
    group: List[TensorLogEntry] = []

    def close() -> None:
        members = [e for e in group if id(e) in alive]
        if len(members) > 1:
            labels = [e.label for e in members]
            for e in members:
                e.call_outputs = labels

    for e in records:
        same_call = (
            group
            and e.output_index is not None
            and e.func is group[-1].func
            and e.call_frames is group[-1].call_frames
            and e.raw_index == group[-1].raw_index + 1
            and all(e.output_index != g.output_index for g in group)
        )
        if group and not same_call:
            close()
            group = []
        if e.kind == "op" and e.output_index is not None:
            group.append(e)
    close()
