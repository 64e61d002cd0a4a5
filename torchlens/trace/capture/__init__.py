"""The capture basement: one traced forward pass, from the wrapped torch functions to the flat
records post-processing turns into a ``ModelHistory``. This face lists what the rest of
torchlens may use; every other module of the folder is private to it (``tests/test_layers.py``
keeps it so).

Running a pass: ``run_pass(model, args, kwargs, plan, random_seed=..., hooks=[...])`` returns a
``PassResult``; ``plan`` (a ``SavePlan``) says what to save; every feature that joins a pass is
a ``PassHook`` (``hooks.py`` states the contract). ``PassSession`` and ``HeldWrappers`` serve
many passes on one model (``log_generate``).

Example:
    >>> import torch
    >>> from torchlens.trace.capture import SavePlan, run_pass
    >>> result = run_pass(torch.nn.Linear(2, 2), (torch.ones(1, 2),), {}, SavePlan(), random_seed=0)
    >>> [r.layer_type for r in result.records]
    ['input', 'linear', 'output']
"""

from __future__ import annotations

from ...collector import CollectionPause, automatic_collection_paused

# tensors inside nested values, at positions as the tracer names them
from .args import replace_tensors, tensors_in, tensors_in_call

# the functions records hold: what replays and saved histories call
from .constructors import allocates_uninitialised
from .copy_on_write import storage_key

# features written as hooks
from .decompose import DecomposeError, FastPathOff, check_decompose, decompositions
from .decorate import wrapper_table
from .hooks import PassHook, PassRecords

# lean passes of a known structure (log_generate): comparing them with the traced one
from .lean import describe, first_difference, signature
from .memory import ActivationMemoryWarning, MemoryCheck
from .meta import MetaCopies, check_device, inputs_on, is_meta_pass, refuse_meta

# the model: its parts, its state a pass must leave as it found it, the random generators
from .modules import BufferSnapshot, ModelInventory, traced_addresses
from .rng import RngState, seed_everything

# running a pass, and what it hands on
from .run import CudaGraphCaptureError, HeldWrappers, PassResult, PassSession, check_not_capturing, run_pass

# what a pass saves, and the one way features enter it
from .save_plan import SavePlan, add_note, has_torchlens_note
from .tracer import empty_out, identity, write_through_view

# compiled and scripted models, the meta device
from .unwrap import compiled_function_notes, eager_only, traceable_model

__all__ = [
    "run_pass",
    "PassResult",
    "PassSession",
    "HeldWrappers",
    "CudaGraphCaptureError",
    "check_not_capturing",
    "SavePlan",
    "add_note",
    "has_torchlens_note",
    "PassHook",
    "PassRecords",
    "DecomposeError",
    "FastPathOff",
    "check_decompose",
    "decompositions",
    "ActivationMemoryWarning",
    "MemoryCheck",
    "describe",
    "first_difference",
    "signature",
    "BufferSnapshot",
    "ModelInventory",
    "traced_addresses",
    "RngState",
    "seed_everything",
    "CollectionPause",
    "automatic_collection_paused",
    "storage_key",
    "compiled_function_notes",
    "eager_only",
    "traceable_model",
    "MetaCopies",
    "check_device",
    "inputs_on",
    "is_meta_pass",
    "refuse_meta",
    "replace_tensors",
    "tensors_in",
    "tensors_in_call",
    "allocates_uninitialised",
    "wrapper_table",
    "empty_out",
    "identity",
    "write_through_view",
]
