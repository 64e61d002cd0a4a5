"""``TorchlensCallback``: watch a LightningModule during ``trainer.fit``.

Example (needs ``pip install lightning``)::

    from torchlens.train.callbacks.lightning import TorchlensCallback
    trainer = lightning.Trainer(callbacks=[TorchlensCallback(log_freq=50, backend="tensorboard")])
    trainer.fit(module, loader)

The watch starts at ``on_fit_start`` and closes at ``on_fit_end`` (also when fitting fails).
Under ``strategy="ddp"`` every process watches its replica and rank 0 writes one run with the
series of the global batch (``torchlens.train.measure.distributed``). Only training steps are logged (validation runs in eval mode without gradients), and
``log_freq`` counts optimizer steps (``trainer.global_step``): with gradient accumulation, the
forward passes of one optimizer step are overlaid as one step. Every module call in
``training_step`` is recorded; the data-flow edges of the module graph come from a trace of the
LightningModule's own ``forward``, so they appear when ``training_step`` calls ``self(x)``.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    except ImportError:
        raise ImportError(
            "torchlens.train.callbacks.lightning needs Lightning: pip install 'torchlens[lightning]' (or pip install lightning)."
        ) from None

from ..step import watch


class TorchlensCallback(Callback):
    """A Lightning callback that runs ``tl.watch(pl_module, **watch_options)`` during fit.

    ``self.watch`` is the watch (``.run_dir``, ``.url``) once fitting has started.
    """

    def __init__(self, **watch_options: Any) -> None:
        super().__init__()
        if "manual_steps" in watch_options:
            raise TypeError("TorchlensCallback starts the steps itself; do not pass manual_steps.")
        self.watch_options = watch_options
        self.watch: Optional[Any] = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # every rank watches: under strategy="ddp" the ranks' counts go to rank 0, which writes
        self.watch = watch(pl_module, manual_steps=True, **self.watch_options)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.watch is not None:
            self.watch.begin_step(trainer.global_step)  # optimizer steps: micro-batches of one step overlay

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.watch is not None and getattr(self.watch, "_ranks", None) is not None:
            self.watch._release()  # the other ranks may not reach the last step's collectives
        else:
            self._close()

    def _close(self) -> None:
        if self.watch is not None:
            self.watch.close()


__all__ = ["TorchlensCallback"]
