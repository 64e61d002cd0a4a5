"""Fuzzing the loader with damaged copies of real saved histories: random truncation, random byte
flips and random JSON edits must each give a ``HistoryFileError`` or a history that works
(prints, finds its layers, reads every saved tensor), never another exception, a hang, or
tensors larger than the folder's files."""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import signal
import traceback
import tracemalloc
from typing import Any, Callable, List

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.validate import validate_history

CASES_PER_KIND = int(os.environ.get("TORCHLENS_FUZZ_CASES", "1000"))  # x3 kinds
CASE_SECONDS = 10  # a case that runs longer than this is a hang
SEED = os.environ.get("TORCHLENS_FUZZ_SEED", "")  # another seed explores other cases


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        for _ in range(2):
            y = y + torch.sigmoid(y)
        return self.fc(y.mean((2, 3))), (y.to_sparse() * 2, y.to(torch.complex64), y > 0)


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> List[pathlib.Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("fuzz-originals")
    h = tl.log_forward_pass(Branchy(), torch.rand(2, 3, 5, 5), save_function_args=True, save_gradients=True)
    h[h.output_layers[0]].activation.sum().backward()
    with_args = pathlib.Path(h.save(root / "branchy"))
    plain = tl.log_forward_pass(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), torch.rand(3, 3))
    return [with_args, pathlib.Path(plain.save(root / "mlp"))]


class _Hang(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def _exercise(folder: pathlib.Path, measure: bool) -> None:
    """Everything a user does with a loaded history that reads from the folder."""
    limit = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    if measure:  # Python-side memory of the load itself: a small multiple of the index's size
        index_size = (folder / "torchlens.json").stat().st_size if (folder / "torchlens.json").exists() else 0
        tracemalloc.start()
        try:
            history = tl.load(folder)
        finally:  # also when the load fails
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak <= 32 * index_size + (1 << 20), f"loading took {peak} bytes for a {index_size}-byte index"
    else:
        history = tl.load(folder)
    str(history)
    for entry in history:
        str(entry)
        assert history[entry.label] is entry
        for name in ("activation", "gradient", "func_args", "func_kwargs", "rng_state"):
            for tensor in _tensors(getattr(entry, name)):
                # nothing made from the folder is larger than the folder
                assert (
                    tensor.is_meta or tensor.layout != torch.strided or tensor.numel() * tensor.element_size() <= limit
                )
        entry.saved_nbytes, entry.grad_nbytes, entry.has_gradient, entry.has_saved_activation
    try:
        validate_history(history)
    except ValueError as error:  # a history missing what validation needs says so
        assert "validate_history" in str(error), str(error)


def _tensors(value: Any, depth: int = 0) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if depth < 8 and type(value) in (list, tuple):
        return [t for v in value for t in _tensors(v, depth + 1)]
    if depth < 8 and type(value) is dict:
        return [t for v in value.values() for t in _tensors(v, depth + 1)]
    return []


def _truncate(folder: pathlib.Path, rng: random.Random) -> str:
    path = rng.choice(sorted(folder.iterdir()))
    data = path.read_bytes()
    cut = rng.randrange(len(data))
    path.write_bytes(data[:cut])
    return f"truncate {path.name} to {cut} of {len(data)} bytes"


def _flip(folder: pathlib.Path, rng: random.Random) -> str:
    path = rng.choice(sorted(folder.iterdir()))
    data = bytearray(path.read_bytes())
    flips = []
    for _ in range(rng.choice((1, 1, 2, 8))):
        # the shard header (first 64 KiB) is mostly padding: aim at the JSON at its start half the time
        end = min(len(data), 2048) if path.suffix == ".safetensors" and rng.random() < 0.5 else len(data)
        at = rng.randrange(end)
        data[at] ^= 1 << rng.randrange(8)
        flips.append(at)
    path.write_bytes(bytes(data))
    return f"flip bits at {flips} of {path.name}"


def _random_value(rng: random.Random, strings: List[str]) -> Any:
    return rng.choice(
        [
            None,
            True,
            -1,
            0,
            rng.randrange(1 << 40),
            1.5,
            "",
            rng.choice(strings),
            [],
            {},
            [rng.choice(strings)],
            {"t": rng.choice(["tensor", "tuple", "size", "func", "dataclass", "dict", "parent", "x"]), "v": []},
            {"t": "tensor", "k": rng.randrange(-2, 50)},
            {"t": "func", "v": rng.choice(["builtins.eval", "torch.relu", "torch.load", "operator.add"])},
        ]
    )


def _containers(value: Any, out: List[Any], depth: int = 0) -> None:
    if isinstance(value, (dict, list)) and depth < 12:
        out.append(value)
        for item in value.values() if isinstance(value, dict) else value:
            _containers(item, out, depth + 1)


def _strings(value: Any, out: List[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            out.append(k)
            _strings(v, out)


def _edit_json(folder: pathlib.Path, rng: random.Random) -> str:
    path = folder / "torchlens.json"
    document = json.loads(path.read_text())
    containers: List[Any] = []
    _containers(document, containers)
    strings: List[str] = []
    _strings(document, strings)
    edits = []
    for _ in range(rng.choice((1, 1, 1, 3))):
        target = rng.choice(containers)
        if isinstance(target, dict) and target:
            key = rng.choice(sorted(target, key=str))
            if rng.random() < 0.2:
                del target[key]
                edits.append(f"del {key!r}")
                continue
        elif isinstance(target, list) and target:
            key = rng.randrange(len(target))
            if rng.random() < 0.2:
                del target[key]
                edits.append(f"del [{key}]")
                continue
        else:
            continue
        old = target[key]
        if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.5:
            new = old + rng.choice((-1, 1, 1 << 33, -old - 1))  # near misses: off by one, huge, negative
        elif isinstance(old, str) and rng.random() < 0.5:
            new = rng.choice(strings)  # another name of the same file: a label, a tag, a path
        else:
            new = _random_value(rng, strings)
        target[key] = new
        edits.append(f"[{key!r}] {str(old)[:30]} -> {str(new)[:30]}")
    path.write_text(json.dumps(document))
    return "; ".join(edits)


def _run(kind: Callable[[pathlib.Path, random.Random], str], originals, tmp_path) -> None:
    rng = random.Random(f"torchlens-fuzz-{kind.__name__}{SEED}")
    failures = []
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for case in range(CASES_PER_KIND):
            folder = tmp_path / f"case{case}"
            shutil.copytree(originals[case % len(originals)], folder)
            what = kind(folder, rng)
            signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
            try:
                _exercise(folder, measure=case % 10 == 0)
            except tl.HistoryFileError:
                pass
            except _Hang:
                failures.append(f"case {case} ({what}): still running after {CASE_SECONDS} s")
            except Exception as error:  # noqa: BLE001 - the finding this test reports
                tb = traceback.format_exception(type(error), error, error.__traceback__)[-3:]
                failures.append(f"case {case} ({what}): {type(error).__name__}: {error}\n{''.join(tb)}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            shutil.rmtree(folder)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not failures, f"{len(failures)} of {CASES_PER_KIND} cases:\n" + "\n".join(failures[:5])


@pytest.mark.slow
@pytest.mark.parametrize("kind", [_truncate, _flip, _edit_json], ids=["truncate", "flip", "json"])
def test_damaged_histories_give_a_file_error_or_a_working_history(kind, originals, tmp_path):
    _run(kind, originals, tmp_path)
