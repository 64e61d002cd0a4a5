"""What the watch sees of a model: its module-call graph (``calls``: one ``Call`` per module
call, read off one traced forward pass) and the modules behind compiled and wrapped models
(``compiled``: ``unwrap``, ``named_modules``, and the switch that runs a compiled model eagerly
on logged steps).

Example:
    >>> import torch
    >>> from torchlens.train.model import call_id, named_modules
    >>> [address for address, _ in named_modules(torch.nn.Sequential(torch.nn.Linear(2, 2)))]
    ['', '0']
    >>> call_id("0", 1)
    '0:1'
"""

from .calls import Call, call_id, input_tensors, module_info, output_tensors, position_name, trace_calls
from .compiled import (
    CompileSwitch,
    compiled_parts,
    dynamo_counts,
    hookable_modules,
    is_optimized,
    named_modules,
    unwrap,
)

__all__ = [
    "Call",
    "call_id",
    "input_tensors",
    "output_tensors",
    "module_info",
    "position_name",
    "trace_calls",
    "CompileSwitch",
    "compiled_parts",
    "dynamo_counts",
    "hookable_modules",
    "is_optimized",
    "named_modules",
    "unwrap",
]
