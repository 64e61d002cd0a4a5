"""``log_forward_pass(save_to=folder)``: activations go to disk the moment they are produced.

Each saved activation is appended to a safetensors shard as soon as the operation that made it
returns (no copy is kept in memory: only a small ``Written`` record), so the memory a pass needs
stays near that of a plain forward pass however much is saved. When the pass is over the
structure is written as in ``ModelHistory.save`` and the history returned is
``torchlens.load(folder)``.
"""

from __future__ import annotations

import os
import shutil
from time import perf_counter
from typing import Any, Optional

import torch

from ...arguments import ArgumentValueError, PathExistsError
from ..capture import SavePlan
from .codec import Encoder, Written
from .save import INDEX_FILE, encode_history, write_index
from .shards import ShardWriter
from .unfinished import OWNER_FILE, mark_finished, mark_unfinished, unfinished_writer, writer_is_gone


class StreamingSavePlan(SavePlan):
    """A ``SavePlan`` whose copies are written to the shards instead of kept."""

    keeps_tensors = False

    def __init__(self, stream: "StreamedSave", **options: Any) -> None:
        super().__init__(**options)
        self.stream = stream

    def copy(self, tensor: torch.Tensor, entry: Optional[Any] = None) -> Any:
        encoder = self.stream.encoder
        encoder.where = f"{entry.layer_type} (operation #{entry.raw_index + 1})" if entry is not None else "a tensor"
        # the bytes are written now, so later in-place changes cannot reach them: no clone needed
        value = tensor.detach() if self.postfunc is None else super().copy(tensor, entry)
        return Written(encoder.value(value))


class StreamedSave:
    """The folder of one ``save_to`` pass: created before the pass, finished after it, and
    removed again if the pass fails."""

    def __init__(self, folder: Any, save_gradients: bool = False) -> None:
        if save_gradients:
            raise ArgumentValueError(
                "save_to= and save_gradients=True cannot be combined: gradients arrive when you call .backward() "
                "after the pass, through activations that save_to keeps on disk, not in the autograd graph. Trace "
                "without save_to to record gradients, then history.save(folder)."
            )
        folder = os.fspath(folder)
        self.folder = folder
        self.created = not os.path.exists(folder)
        if not self.created and (not os.path.isdir(folder) or os.listdir(folder)):
            writer = unfinished_writer(folder) if os.path.isdir(folder) else None
            if writer is not None and not os.path.exists(os.path.join(folder, INDEX_FILE)):
                raise PathExistsError(
                    f"save_to: {folder} holds an unfinished torchlens save (process {writer[1]} on {writer[0]} was "
                    f"stopped before it finished{'' if writer_is_gone(writer) else ', or is still writing it'}); it "
                    "is not a history and can be removed (shutil.rmtree), then run again. Nothing is overwritten."
                )
            raise PathExistsError(
                f"save_to: {folder} exists and is not an empty folder; choose a new folder (nothing is overwritten)."
            )
        os.makedirs(folder, exist_ok=True)
        mark_unfinished(folder)
        self.writer = ShardWriter(folder)
        self.encoder = Encoder(self.writer, dedupe=False)  # nothing kept alive while the pass runs
        self.started = perf_counter()
        self.write_seconds = 0.0

    def plan(self, **options: Any) -> StreamingSavePlan:
        return StreamingSavePlan(self, **options)

    def __enter__(self) -> "StreamedSave":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None:
            self.abort()

    def abort(self) -> None:
        """Remove what this pass wrote (the folder too if the pass created it)."""
        self.writer.abort()
        if self.created:
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            for name in os.listdir(self.folder):
                if name.startswith("tensors-") or name.startswith(INDEX_FILE) or name == OWNER_FILE:
                    try:
                        os.remove(os.path.join(self.folder, name))
                    except OSError:
                        pass

    def finish(self, history: Any) -> Any:
        """Write the structure and return the history as ``torchlens.load`` gives it."""
        from .load import load_history

        try:
            self.encoder.dedupe = True  # parameters among saved function arguments: once each
            document = encode_history(history, self.encoder)
            self.writer.close()
            write_index(self.folder, document, self.writer, self.encoder)
            mark_finished(self.folder)
        except BaseException:
            self.abort()
            raise
        return load_history(self.folder)


__all__ = ["StreamedSave", "StreamingSavePlan"]
