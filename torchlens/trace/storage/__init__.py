"""Saving and loading histories: a folder of JSON and safetensors files, no pickle.

Layout of a saved folder::

    torchlens.json            format and version, every entry's fields, call stacks with their
                              source text, the tensor index (file, name, dtype, shape, CRC-32)
    tensors-00000.safetensors activations, gradients and tensors among saved function arguments
    tensors-00001.safetensors ... (a new shard about every GiB)
"""

from __future__ import annotations

import os
from typing import Union

from ...arguments import require_path
from ..history.extensions import provide
from ..history.model_history import ModelHistory
from .codec import UnavailableFunction, Unsaved
from .errors import HistoryFileError
from .load import load_history
from .save import FORMAT_VERSION, UnsavedValuesWarning, save_history
from .stream import StreamedSave

provide("save", save_history)


def load(path: Union[str, "os.PathLike[str]"]) -> ModelHistory:
    """Open a history saved with ``history.save(path)`` (or traced with ``save_to=path``).

    Opening reads only ``torchlens.json``: activations, gradients and saved function arguments
    are read (memory-mapped) when first used, so a large history opens at once. The folder is
    treated as untrusted input: only files inside it are read, nothing in it is executed, and a
    loaded history calls (in validation, ``rerun``) only operations torchlens traces; any other
    function it names is kept as an unavailable function. A missing, truncated, corrupted or
    edited file, or a format newer than this torchlens reads, raises ``HistoryFileError``
    naming the file and, where it is one layer's, the layer.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()), torch.ones(1, 3))
        >>> loaded = tl.load(h.save(tempfile.mkdtemp() + "/run"))
        >>> loaded.layer_labels == h.layer_labels, loaded['relu_1_2'].parent_layers
        (True, ['linear_1_1'])
    """
    return load_history(require_path("path", path, "tl.load", exists=True))


__all__ = [
    "load",
    "load_history",
    "HistoryFileError",
    "UnsavedValuesWarning",
    "FORMAT_VERSION",
    "StreamedSave",
    "UnavailableFunction",
    "Unsaved",
]
