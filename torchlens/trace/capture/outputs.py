"""Which arguments of a call each of its outputs comes from, and how an output's position is
written (``output.0``, ``input.x.1``)."""

from __future__ import annotations

from typing import Dict, List, Tuple

from ..records.position import Position
from ..records.tensor_log import TensorLogEntry

Parents = List[Tuple[TensorLogEntry, Position]]  # (parent record, where it sat among the call's arguments)

# Functions whose i-th output is computed from the i-th tensor argument only.
POSITIONAL_OUTPUTS = frozenset({"broadcast_tensors", "meshgrid", "atleast_1d", "atleast_2d", "atleast_3d"})


# Multi-output functions whose output k is computed from some arguments only (output -> the
# argument positions that feed it): jvp(f, primals, tangents) -> (f(primals), tangents out[, aux]);
# _pack_padded_sequence(input, lengths) -> (data, batch sizes from the lengths);
# _pad_packed_sequence(data, batch_sizes, ...) -> (padded, lengths from the batch sizes).
OUTPUT_PARENTS: Dict[str, Dict[Position, Tuple[Position, ...]]] = {
    "jvp": {0: (0,), 2: (0,)},
    "_pack_padded_sequence": {1: (1, "lengths")},
    "_pad_packed_sequence": {1: (1, "batch_sizes")},
}


def head(position: Position) -> Position:
    return position[0] if isinstance(position, tuple) and position else position


def is_out_position(position: Position) -> bool:
    return position == "out" or (isinstance(position, tuple) and position[:1] == ("out",))


def matching_parents(parents: Parents, position: Position) -> Parents:
    """Parents of output ``i``: the argument at ``i`` (``f(a, b)``) or ``(0, i)`` (``f([a, b])``)."""
    index = position[-1] if isinstance(position, tuple) else position
    return [(p, pos) for p, pos in parents if pos == index or pos == (0, index)]


def dotted(position: Position) -> str:
    if position == ():
        return ""
    if isinstance(position, tuple):
        return "." + ".".join(map(str, position))
    return f".{position}"


__all__ = ["OUTPUT_PARENTS", "POSITIONAL_OUTPUTS", "dotted", "head", "is_out_position", "matching_parents"]
