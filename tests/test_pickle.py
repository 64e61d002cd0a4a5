"""pickle and copy.deepcopy of a ModelHistory: same labels, activations and call stacks, in this
process and in a child process; source text readable where the model's file is gone."""

from __future__ import annotations

import copy
import importlib.util
import linecache
import multiprocessing
import pickle
import warnings

import torch
from torch import nn

import torchlens as tl


class Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(2):
            x = torch.relu(self.fc(x)) + 1
        return x * 2


def describe(history: tl.ModelHistory):
    """What a user reads off a history: labels, activations and call-stack text."""
    return (
        history.layer_labels,
        [e.activation for e in history],
        [[repr(location) for location in e.func_call_stack] for e in history],
    )


def _same(a, b) -> None:
    labels_a, activations_a, stacks_a = a
    labels_b, activations_b, stacks_b = b
    assert labels_a == labels_b
    assert all(torch.equal(x, y) for x, y in zip(activations_a, activations_b))
    assert stacks_a == stacks_b and any("x = torch.relu(self.fc(x)) + 1" in s for stack in stacks_a for s in stack)


def test_pickle_round_trip_in_this_process():
    h = tl.log_forward_pass(Loop(), torch.rand(2, 3), save_function_args=True)
    again = pickle.loads(pickle.dumps(h))
    _same(describe(h), describe(again))
    assert str(again) == str(h)
    assert again["fc:2"].label == h["fc:2"].label  # lookups work


def test_pickle_round_trip_in_a_spawned_process():
    h = tl.log_forward_pass(Loop(), torch.rand(2, 3))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        seen = pool.apply(describe, (h,))  # the history is pickled to the child, the description back
    _same(describe(h), seen)


def test_source_text_survives_the_model_file(tmp_path):
    path = tmp_path / "gone_model.py"
    path.write_text(
        "import torch\n\n\nclass Gone(torch.nn.Module):\n    def forward(self, x):\n"
        "        y = x * 3  # the line to find\n        return y.sum()\n"
    )
    spec = importlib.util.spec_from_file_location("gone_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    h = tl.log_forward_pass(module.Gone(), torch.ones(2))
    before = [[repr(location) for location in e.func_call_stack] for e in h]
    data = pickle.dumps(h)
    path.unlink()
    linecache.clearcache()
    again = pickle.loads(data)
    assert [[repr(location) for location in e.func_call_stack] for e in again] == before
    assert again["mul_1_1"].func_call_stack[-1].code_line == "y = x * 3  # the line to find"
    # saved after the file is gone, the history keeps the text it carried (it was saved empty)
    loaded = tl.load(again.save(str(tmp_path / "saved")))
    assert loaded["mul_1_1"].func_call_stack[-1].code_line == "y = x * 3  # the line to find"


def test_deepcopy_is_independent_of_the_original():
    h = tl.log_forward_pass(Loop(), torch.rand(2, 3))  # activations keep their autograd graph
    assert h["linear_1_1:1"].activation.grad_fn is not None
    twin = copy.deepcopy(h)
    _same(describe(h), describe(twin))
    with torch.no_grad():
        twin["linear_1_1:1"].activation.zero_()
    assert h["linear_1_1:1"].activation.abs().sum() > 0
    assert copy.copy(h)["relu_1_2:1"] is h["relu_1_2:1"]  # a shallow copy shares the entries


def test_a_loaded_history_pickles_with_its_values(tmp_path):
    h = tl.log_forward_pass(Loop(), torch.rand(2, 3))
    loaded = tl.load(h.save(tmp_path / "run"))
    again = pickle.loads(pickle.dumps(loaded))
    _same(describe(h), describe(again))


def test_a_history_with_gradients_pickles_without_warnings():
    h = tl.log_forward_pass(Loop(), torch.rand(2, 3), save_gradients=True)
    h[h.output_layers[0]].activation.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about hooks it cannot pickle
        again = pickle.loads(pickle.dumps(h))
    assert torch.equal(again["linear_1_1:1"].gradient, h["linear_1_1:1"].gradient)
