"""log_forward_pass(save_to=folder): activations written to disk as they are produced."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.render import build_dot
from torchlens.trace.validate import validate_history


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y.add_(1)  # an in-place change after y was saved: the saved value must be the one before
        return self.fc(y.mean((2, 3))), y.sum()


class Fails(nn.Module):
    def forward(self, x):
        y = torch.relu(x) * 2
        raise RuntimeError("the model failed")


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    return a.dtype == b.dtype and bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def test_streamed_history_equals_a_saved_one(tmp_path):
    model, x = Branchy().eval(), torch.rand(2, 3, 6, 6)
    in_memory = tl.log_forward_pass(model, x, save_function_args=True, random_seed=3)
    streamed = tl.log_forward_pass(model, x, save_function_args=True, random_seed=3, save_to=tmp_path / "s")
    assert streamed.layer_labels == in_memory.layer_labels
    for a, b in zip(in_memory, streamed):
        assert (a.activation is None) == (b.activation is None), a.label
        if a.activation is not None:
            assert _bitwise(a.activation, b.activation), a.label
    assert build_dot(streamed).source == build_dot(in_memory).source
    again = tl.load(tmp_path / "s")  # the folder is a normal saved history
    assert again.layer_labels == in_memory.layer_labels
    assert _bitwise(again["relu_1_5"].activation, in_memory["relu_1_5"].activation)
    assert validate_history(streamed)  # the replay of every op agrees with what was streamed


def test_streamed_activations_are_not_kept_in_memory(tmp_path):
    model, x = Branchy().eval(), torch.rand(2, 3, 6, 6)
    streamed = tl.log_forward_pass(model, x, save_to=tmp_path / "s")
    entry = streamed["conv2d_1_1"]
    assert "activation" in getattr(entry, "_pending", {})  # still on disk until read
    assert entry.activation.shape == (2, 4, 6, 6)
    shards = [n for n in os.listdir(tmp_path / "s") if n.startswith("tensors-")]
    assert shards and sum(os.path.getsize(tmp_path / "s" / n) for n in shards) >= streamed.saved_tensor_bytes


def test_subset_and_postfunc(tmp_path):
    model, x = Branchy().eval(), torch.rand(2, 3, 6, 6)
    h = tl.log_forward_pass(
        model,
        x,
        layers_to_save=["conv2d_1_1", "linear"],
        save_to=tmp_path / "a",
        activation_postfunc=lambda t: t.mean(),
    )
    expected = tl.log_forward_pass(
        model, x, layers_to_save=["conv2d_1_1", "linear"], activation_postfunc=lambda t: t.mean()
    )
    assert h.layer_labels == expected.layer_labels
    for a, b in zip(expected, h):
        assert torch.equal(a.activation, b.activation)


def test_a_failing_pass_leaves_no_folder(tmp_path):
    with pytest.raises(RuntimeError, match="the model failed"):
        tl.log_forward_pass(Fails(), torch.rand(3), save_to=tmp_path / "gone")
    assert not (tmp_path / "gone").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="the model failed"):
        tl.log_forward_pass(Fails(), torch.rand(3), save_to=tmp_path / "empty")
    assert (tmp_path / "empty").is_dir() and not os.listdir(tmp_path / "empty")  # an existing folder is kept


def test_bad_folders_and_options_are_refused_before_the_pass(tmp_path):
    calls = []

    class Counting(nn.Module):
        def forward(self, x):
            calls.append(1)
            return x * 2

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty folder"):
        tl.log_forward_pass(Counting(), torch.rand(3), save_to=tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="save_to= and save_gradients=True cannot be combined"):
        tl.log_forward_pass(Counting(), torch.rand(3), save_to=tmp_path / "g", save_gradients=True)
    assert not calls and not (tmp_path / "g").exists()
