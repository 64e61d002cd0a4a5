"""Save and load of whole histories: time and size against the raw bytes of the saved tensors.

For each model, every layer saved (``layers_to_save='all'``, and ``save_function_args=True`` so
that the history can be replayed after loading):

- ``raw MB``: bytes of the saved activations (``history.saved_tensor_bytes``);
- ``folder MB``: what ``history.save`` wrote (index and shards; the shards also hold the tensors
  among saved function arguments, parameters included, each once);
- ``save s``: ``history.save(folder)``, and its throughput over the folder's size;
- ``open s``: ``tl.load(folder)`` (reads the index only: activations stay on disk);
- ``read s``: reading every activation of the loaded history (memory-mapped, CRC-checked);
- ``trace s``: the ``log_forward_pass`` itself, for scale.

    python benchmarks/save_load_speed.py                 # resnet50 gpt2
    python benchmarks/save_load_speed.py resnet18

Numbers are printed, not asserted. The page cache makes a second read of a folder faster; each
model is saved into a new folder and read once.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

import torchlens as tl


def build(name: str):
    if name == "gpt2":
        import transformers

        config = transformers.GPT2Config(n_layer=12, use_cache=False)
        return transformers.GPT2LMHeadModel(config).eval(), (torch.randint(0, config.vocab_size, (1, 128)),)
    import torchvision

    return getattr(torchvision.models, name)(weights=None).eval(), (torch.rand(1, 3, 224, 224),)


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))


def main() -> None:
    torch.set_num_threads(1)
    names = sys.argv[1:] or ["resnet50", "gpt2"]
    print(
        f"{'model':<10} {'layers':>6} {'raw MB':>8} {'folder MB':>9} {'trace s':>8} {'save s':>7} {'MB/s':>6} "
        f"{'open s':>7} {'read s':>7}"
    )
    for name in names:
        model, args = build(name)
        start = time.perf_counter()
        history = tl.log_forward_pass(model, list(args), layers_to_save="all", save_function_args=True, random_seed=0)
        trace = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, name)
            start = time.perf_counter()
            history.save(folder)
            save = time.perf_counter() - start
            size = folder_bytes(folder)
            start = time.perf_counter()
            loaded = tl.load(folder)
            opened = time.perf_counter() - start
            start = time.perf_counter()
            read = sum(e.activation.nelement() for e in loaded if isinstance(e.activation, torch.Tensor))
            reading = time.perf_counter() - start
            assert read > 0
            del loaded
        raw = history.saved_tensor_bytes / 2**20
        print(
            f"{name:<10} {len(history):>6} {raw:>8.0f} {size / 2**20:>9.0f} {trace:>8.2f} {save:>7.2f} "
            f"{size / 2**20 / save:>6.0f} {opened:>7.3f} {reading:>7.2f}"
        )


if __name__ == "__main__":
    main()
