"""Raw records of a pass -> a ``ModelHistory``. Each step is a function over the records."""

from __future__ import annotations

from time import perf_counter
from typing import Dict, List, Tuple

import torch

from ..capture import PassResult
from ..history.model_history import ModelHistory, ModuleInfo
from ..records.tensor_log import TensorLogEntry
from .graph import children_of, prune
from .labels import assign_labels, link_call_outputs
from .recurrent_passes import group_passes


def build_history(result: PassResult) -> ModelHistory:
    """Prune, group passes, label, link, and wrap the records into a ``ModelHistory``."""
    start = perf_counter()
    inventory = result.inventory
    entries = prune(result.records)
    layers = group_passes(entries, result.module_frame_depths)
    assign_labels(layers)
    link_call_outputs(result.records, entries)
    for (address, pass_num), outputs in result.module_outputs.items():
        for position, e in outputs:
            positions = e.module_output_positions = e.module_output_positions or {}
            positions.setdefault((address, pass_num), position)
    for ref in result.parent_refs:
        ref.name_parent()
    _link(entries, inventory.param_info)
    module_passes = dict(result.module_pass_counts)
    modules = ModuleInfo(
        addresses=[a for a in inventory.module_types if a],
        types=inventory.module_types,
        children=inventory.module_children,
        passes=module_passes,
    )
    no_gradient = _in_reentrant_checkpoint(entries) if result.save_gradients else []
    history = ModelHistory(
        model_name=result.model_name,
        entries=entries,
        lookup=None,  # built on first use
        all_labels=[e.label for e in entries],
        modules=modules,
        param_info=inventory.param_info,
        random_seed=result.random_seed,
        pass_time=result.elapsed,
        postprocess_time=perf_counter() - start,
    )
    history.traced_here = True
    history.notes.extend(result.notes)
    if no_gradient:
        shown = ", ".join(no_gradient[:5]) + (", ..." if len(no_gradient) > 5 else "")
        history.notes.append(
            f"{len(no_gradient)} layers ran inside torch.utils.checkpoint(..., use_reentrant=True) ({shown}) and get "
            "no gradient: reentrant checkpointing runs them without autograd and recomputes them during backward. "
            "Use use_reentrant=False to record their gradients."
        )
    return history


def drop_unsaved(history: ModelHistory) -> ModelHistory:
    """The same history holding only the entries whose activation was saved (labels kept)."""
    entries = [e for e in history.layer_list if e.activation is not None]
    history.replace_entries(entries)  # its index built on first use
    return history


def _link(entries: List[TensorLogEntry], param_info: Dict[str, Tuple[torch.Size, int, int]]) -> None:
    """Parent and child labels, where each parent sat in the call's arguments, the parameters'
    shapes and sizes, and each entry's position in the whole pass (kept if entries are dropped
    later): one loop over the entries, which runs for every operation of every pass."""
    children = children_of(entries)
    total = len(entries)
    for number, e in enumerate(entries, 1):
        positions: Dict[str, list] = {}
        for p, position in e.parent_refs:
            positions.setdefault(p.label, []).append(position)
        e.parent_layers = list(positions)
        e.parent_arg_positions = positions
        e.parent_refs = ()  # the links are labels now; one shared empty tuple, no list per entry
        e.child_layers = [c.label for c in children[e.raw_index]]
        condition = e.branch_condition_record
        if condition is not None and condition.raw_index in children:  # the condition may have been pruned
            e.branch_condition = condition.label
        e.branch_condition_record = None
        if e.param_addresses:
            shapes, count, nbytes = [], 0, 0
            for address in e.param_addresses:
                shape, numel, size = param_info[address]
                shapes.append(shape)
                count += numel
                nbytes += size
            e.param_shapes, e.num_params, e.param_bytes = shapes, count, nbytes
        else:
            e.param_shapes = []
            e.num_params = e.param_bytes = 0
        e.operation_num = number
        e.num_operations = total


def _reentrant_checkpoint_code():
    try:
        from torch.utils.checkpoint import CheckpointFunction

        return CheckpointFunction.forward.__code__
    except (ImportError, AttributeError):  # another torch version: nothing to detect
        return None


def _in_reentrant_checkpoint(entries: List[TensorLogEntry]) -> List[str]:
    """Labels of operations run inside a reentrant ``torch.utils.checkpoint`` (its forward runs
    under ``no_grad``, so no gradient reaches them); each gets ``gradient_note``."""
    code = _reentrant_checkpoint_code()
    if code is None:
        return []
    found = []
    for e in entries:
        if e.kind == "op" and any(c is code for c, _, _ in e.call_frames):
            e.gradient_note = "none: computed inside torch.utils.checkpoint(use_reentrant=True)"
            found.append(e.label)
    return found


__all__ = ["build_history", "drop_unsaved"]
