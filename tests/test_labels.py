"""Lookup keys (torchlens.trace.history.index): per-output keys of modules with several outputs,
ambiguity errors whose advice works, and the outputs of one multi-output call shown together."""

import re

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.render import build_dot


class TwoLSTMCalls(nn.Module):
    """nn.LSTM returns (output, (h_n, c_n)); called twice. A dict-returning block; a loop."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 3, batch_first=True)
        self.block = DictBlock()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        out, (h, c) = self.lstm(out, (h, c))
        parts = self.block(out)
        y = parts["hidden"] * parts["gate"]
        for _ in range(2):
            y = self.fc(y)
        return y + h.sum() + c.sum()


class DictBlock(nn.Module):
    def forward(self, x):
        return {"hidden": torch.tanh(x), "gate": torch.sigmoid(x)}


@pytest.fixture(scope="module")
def history():
    torch.manual_seed(0)
    return tl.log_forward_pass(TwoLSTMCalls(), torch.rand(2, 4, 3), random_seed=0)


def test_each_output_of_a_module_call_has_a_key(history):
    first = [history[k] for k in ("lstm:1.0", "lstm:1.1.0", "lstm:1.1.1")]
    assert [e.layer_type for e in first] == ["lstm"] * 3 and len({e.label for e in first}) == 3
    assert history["lstm:1.0"].shape == (2, 4, 3) and history["lstm:2.1.1"].shape == (1, 2, 3)
    assert history["lstm:2.0"] is not history["lstm:1.0"]
    assert history["block:1.hidden"].layer_type == "tanh" and history["block:1.gate"].layer_type == "sigmoid"
    assert "lstm:1.1.0" in history["lstm:1.1.0"].lookup_keys


def _suggested(history, key):
    with pytest.raises(KeyError) as info:
        history[key]
    message = str(info.value)
    suggestions = re.findall(r"'([^']+)'", message.split("names it alone:")[1])
    assert suggestions, message
    return message, suggestions


@pytest.mark.parametrize(
    "key, expected",
    [
        ("lstm", ["lstm:1.0", "lstm:1.1.0", "lstm:1.1.1", "lstm:2.0", "lstm:2.1.0", "lstm:2.1.1"]),
        ("lstm:2", ["lstm:2.0", "lstm:2.1.0", "lstm:2.1.1"]),
        ("block", ["block:1.hidden", "block:1.gate"]),
        ("fc", ["fc:1", "fc:2"]),
        ("linear_1", ["linear_1_9:1", "linear_1_9:2"]),
    ],
)
def test_ambiguity_errors_suggest_keys_that_work(history, key, expected):
    message, suggestions = _suggested(history, key)
    assert suggestions[: len(expected)] == expected[:6]
    labels = message.split("): ")[1].split(". Pick")[0].split(", ")
    assert [history[k].label for k in suggestions] == labels[: len(suggestions)]  # each names one layer


def test_outputs_of_one_call_are_shown_together(history, capsys):
    labels = history["lstm:1.0"].call_outputs
    assert len(labels) == 3 and labels == [history[k].label for k in ("lstm:1.0", "lstm:1.1.0", "lstm:1.1.1")]
    history.print_layers()
    summary = capsys.readouterr().out
    assert f"{labels[1]} (output 2 of 3 of one lstm call)" in summary
    entry = str(history[labels[2]])
    assert "(output 3 of 3 of one lstm call)" in entry and f"Outputs of the same call: {', '.join(labels)}" in entry
    assert "Output of modules: lstm:1 (output 1.1)" in entry
    assert "output 1 of 3 of one call" in build_dot(history).source
    assert history["fc:1"].call_outputs is None and "of one" not in str(history["fc:1"])


def test_output_keys_in_layers_to_save():
    torch.manual_seed(0)
    h = tl.log_forward_pass(TwoLSTMCalls(), torch.rand(2, 4, 3), layers_to_save=["lstm:2.1.0"], random_seed=0)
    assert len(h) == 1 and h["lstm:2.1.0"].activation.shape == (1, 2, 3)
