"""What the tracer's caches must not change: source locations read once per call site, the
per-type verdicts of the scans for tensors held by modules and module globals."""

from __future__ import annotations

import inspect
import sys
from typing import Any, Tuple

import torch
from torch import nn

import torchlens as tl
from torchlens.trace.capture.modules import tensors_held
from torchlens.trace.capture.stack import StackWalker


class _Claims:
    """A proxy whose ``__class__`` is its target's (as ``unittest.mock``'s ``spec`` does):
    isinstance answers for the target, so two instances of one type answer differently."""

    def __init__(self, target: object) -> None:
        self._target = target

    @property  # type: ignore[misc]
    def __class__(self):  # noqa: D105
        return type(self._target)


def test_held_tensors_follow_isinstance_for_objects_claiming_a_class() -> None:
    tensor_proxy, int_proxy = _Claims(torch.zeros(1)), _Claims(3)
    for first, second in ((int_proxy, tensor_proxy), (tensor_proxy, int_proxy)):
        found: dict = {}
        tensors_held({"a": first, "b": second}, found)
        assert found == {id(tensor_proxy): tensor_proxy}


def test_a_container_seen_shallow_is_looked_into_again_deeper() -> None:
    outer, inner = torch.zeros(1), torch.ones(1)
    shared = [outer, [inner]]
    found: dict = {}
    seen: dict = {}
    tensors_held({"x": shared}, found, depth=1, seen=seen)
    assert set(found) == {id(outer)}
    tensors_held({"y": shared}, found, depth=2, seen=seen)
    assert set(found) == {id(outer), id(inner)}


class _Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.relu(self.fc(x))
        return torch.sigmoid(x) + 1


def test_source_lines_of_repeated_and_distinct_call_sites() -> None:
    history = tl.log_forward_pass(_Loop(), torch.rand(2, 3), layers_to_save=None)
    lines, start = inspect.getsourcelines(_Loop.forward)
    line_of = {text.strip().split("(")[0]: start + i for i, text in enumerate(lines)}
    expected = {
        "relu": line_of["x = torch.relu"],
        "sigmoid": line_of["return torch.sigmoid"],
        "add": line_of["return torch.sigmoid"],
    }
    seen: dict = {}
    for e in history.layer_list:
        if e.layer_type in expected:
            code, line, offset = e.call_frames[-1]
            assert code is _Loop.forward.__code__ and line == expected[e.layer_type]
            seen.setdefault(e.layer_type, set()).add(offset)
    # three passes of relu at one instruction; sigmoid and add at two instructions of one line
    assert len(seen["relu"]) == 1 and seen["sigmoid"] != seen["add"]
    assert len([e for e in history.layer_list if e.layer_type == "relu"]) == 3
    # one record per code and offset in a pass: post-processing tells call sites apart by identity
    relus = [e.call_frames for e in history.layer_list if e.layer_type == "relu"]
    assert all(frames[-1] is relus[0][-1] for frames in relus)
    assert [e.num_passes for e in history.layer_list if e.layer_type == "relu"] == [3, 3, 3]


def test_call_stacks_taken_from_known_frames_equal_full_walks(monkeypatch):
    """The walker takes a frame's callers from the last walks when the frame is still in the
    same call: the stacks (and the frame depths of module calls) equal walks from scratch, also
    through generators (resumed from other callers) and a loop calling from one line."""
    from torchlens.trace.capture import SavePlan, run_pass

    class Gen(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # the ReLU's operation has no parameters: its frame depth is counted (_note_frame_depth)
            self.layers = torch.nn.ModuleList(
                [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(3)]
            )

        def parts(self, x):
            for layer in self.layers:
                x = layer(x).relu()
                yield x

        def forward(self, x):
            total = sum(y.sum() for y in self.parts(x))
            for layer in self.layers:
                x = layer(x)
            return total + torch.stack(list(self.parts(x))).mean()

    def stacks():
        result = run_pass(Gen(), (torch.ones(2, 4),), {}, SavePlan(), random_seed=0)
        frames = [tuple((c[0].co_name, c[1], c[2]) for c in r.call_frames) for r in result.records]
        return frames, result.module_frame_depths

    for _ in range(3):  # the interpreter specialises a call (its offset moves) after a few runs
        stacks()
    torch.manual_seed(0)
    cached = stacks()
    monkeypatch.setattr(StackWalker, "_remember", lambda self, new, records, place: None)
    torch.manual_seed(0)
    assert stacks() == cached
    assert any(len(f) > 2 for f in cached[0]) and cached[1]


def test_one_walk_of_the_model_serves_the_checks_and_the_pass(monkeypatch):
    """``log_forward_pass`` walks the model's modules once, for its checks and its pass; a
    second pass (labels to resolve first) makes its own inventory, after the first one ran."""
    from torchlens.trace.capture import modules

    walks = []
    real_of, real_walk = modules.ModelInventory.of.__func__, modules.traced_modules

    def counted_of(cls, model):
        walks.append("inventory")
        return real_of(cls, model)

    def counted_walk(model):
        walks.append("walk")
        return real_walk(model)

    monkeypatch.setattr(modules.ModelInventory, "of", classmethod(counted_of))
    monkeypatch.setattr(modules, "traced_modules", counted_walk)
    model, x = nn.Sequential(nn.Linear(3, 3), nn.ReLU()), torch.randn(2, 3)
    history = tl.log_forward_pass(model, x)
    assert walks == ["inventory"] and history["linear_1_1"].num_params == 12
    walks.clear()
    history = tl.log_forward_pass(model, x, layers_to_save=["relu_1_2"])
    assert walks.count("inventory") == 2 and history["relu_1_2"].activation is not None
    walks.clear()
    history = tl.log_forward_pass(model, x, device="meta")  # parameters swapped for the pass: walked again
    assert walks.count("inventory") == 2 and history["linear_1_1"].activation.is_meta


def test_a_lean_pass_takes_the_innermost_frame_a_full_walk_records() -> None:
    """``StackWalker.innermost`` (a lean pass's one frame) is the frame of the last record of
    ``walk``: a code the walk passes over (a wrapper, torch's module call) is skipped there too."""

    def wrapper() -> Tuple[Any, Any]:  # stands for a wrapper: its code is skipped
        frame = sys._getframe()
        return walker.walk(frame), walker.innermost(frame)

    def model_code() -> Tuple[Any, Any]:
        return wrapper()

    walker = StackWalker(stop_code=None, skip_code_ids=frozenset({id(wrapper.__code__)}))
    records, innermost = model_code()
    assert records[-1][0] is model_code.__code__
    assert innermost is not None and innermost.f_code is model_code.__code__
