"""The Hugging Face Trainer callback: a tiny model built from a config, a few steps on CPU."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

import torchlens as tl  # noqa: E402
from torchlens.train.callbacks.hf import TorchlensCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 8, vocab: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _train(tmp_path, callback, max_steps=4, accumulation=1, model=None):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    model = model if model is not None else _tiny_gpt2()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(16), callbacks=[callback])
    trainer.train()
    return model


def test_the_trainer_is_watched_and_the_run_is_under_output_dir(tmp_path):
    callback = TorchlensCallback(log_freq=2, backend=None, verbose=False)
    model = _train(tmp_path, callback, max_steps=5)
    w = callback.watch
    assert w.closed  # on_train_end closed it: no hook left on the model
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert os.path.dirname(w.run_dir) == str(tmp_path / "out" / "torchlens_runs")
    with tl.open_run(w.run_dir) as run:
        assert run.steps.tolist() == [0, 2, 4]  # optimizer steps 0..4, every second one
        assert run.status == "finished"
        calls = run.calls
        assert "transformer:1" in calls and "lm_head:1" in calls
        grads = run.series("lm_head:1", "params_grad", "weight")
        assert grads.counts.shape[0] == 3 and (grads.count > 0).all()


def test_gradient_accumulation_overlays_the_micro_batches_of_one_step(tmp_path):
    callback = TorchlensCallback(log_freq=1, log=("io",), backend=None, verbose=False)
    _train(tmp_path, callback, max_steps=2, accumulation=2)
    with tl.open_run(callback.watch.run_dir) as run:
        assert run.steps.tolist() == [0, 1]
        # two micro-batches of 2 sequences of 8 tokens each: the embedding's input counts all of them
        series = run.series("transformer.wte:1", "io", "input 0")
        assert series.count.tolist() == [32.0, 32.0]


def test_a_run_dir_option_is_used_and_watch_options_are_checked(tmp_path):
    callback = TorchlensCallback(log_freq=3, backend=None, verbose=False, run_dir=str(tmp_path / "mine"))
    _train(tmp_path, callback, max_steps=2)
    assert callback.watch.run_dir == str(tmp_path / "mine")
    with pytest.raises(TypeError, match="manual_steps"):
        TorchlensCallback(manual_steps=True)
    bad = TorchlensCallback(log=("nonsense",), backend=None, verbose=False)
    with pytest.raises(ValueError, match="log takes one of 'io'"):
        _train(tmp_path, bad, max_steps=1)
