"""``TorchlensCallback``: watch a model while a Hugging Face ``Trainer`` trains it.

Example (needs ``pip install 'torchlens[hf]'``: transformers and accelerate)::

    from transformers import Trainer
    from torchlens.train.callbacks.hf import TorchlensCallback
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[TorchlensCallback(log_freq=50, log=("io", "params_grad"))])
    trainer.train()   # the run is written under args.output_dir/torchlens_runs/

The watch starts at ``on_train_begin`` (``tl.watch(model, manual_steps=True, **watch_options)``)
and closes at ``on_train_end``. Steps are optimizer steps: step ``n`` begins at
``on_step_begin`` with ``state.global_step == n`` and continues after each micro-batch
(``on_substep_end``), so the micro-batches of gradient accumulation are overlaid as one step,
and ``log_freq`` counts optimizer steps. Evaluation
runs without gradients and is not logged. Under ``accelerate``/DDP every process watches its
replica and rank 0 writes one run with the series of the global batch (as ``tl.watch`` does
under ``torch.distributed``). The Trainer's own logging (``report_to``) is left as it is.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Optional

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "torchlens.train.callbacks.hf needs transformers: pip install 'torchlens[hf]' (or pip install transformers accelerate)."
    ) from None

from ..step import watch

RUNS_FOLDER = "torchlens_runs"  # under the Trainer's output_dir


def run_dir_under(output_dir: str, model_name: str) -> str:
    """A new run folder ``output_dir/torchlens_runs/<time>-<model>`` (numbered if it exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(output_dir, RUNS_FOLDER, f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', model_name)}")
    folder, k = base, 1
    while os.path.exists(folder):
        k += 1
        folder = f"{base}-{k}"
    return folder


class TorchlensCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that runs ``tl.watch(model, **watch_options)`` while
    the Trainer trains (``log_freq``, ``log``, ``backend``, ... as ``tl.watch`` takes them).

    ``self.watch`` is the watch (``.run_dir``, ``.url``) once training has begun. Without a
    ``run_dir`` option the run goes under ``args.output_dir/torchlens_runs/``.
    """

    def __init__(self, **watch_options: Any) -> None:
        if "manual_steps" in watch_options:
            raise TypeError("TorchlensCallback begins the steps itself; do not pass manual_steps.")
        if "model" in watch_options:
            raise TypeError("TorchlensCallback watches the Trainer's model; do not pass model.")
        self.watch_options = watch_options
        self.watch: Optional[Any] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise TypeError("TorchlensCallback: the Trainer passed no model to on_train_begin.")
        self._close()  # a second trainer.train() with the same callback starts a new run
        options = dict(self.watch_options)
        if options.get("run_dir") is None:
            options["run_dir"] = run_dir_under(args.output_dir, type(model).__name__)
        self.watch = watch(model, manual_steps=True, **options)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watch is not None:
            self.watch.begin_step(state.global_step)  # optimizer steps: micro-batches of one step overlay

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # gradient accumulation: the next micro-batch's forward belongs to the same step
        if self.watch is not None:
            self.watch.begin_step(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self.watch is not None and not self.watch.closed:
            self.watch.close()


__all__ = ["TorchlensCallback", "run_dir_under"]
