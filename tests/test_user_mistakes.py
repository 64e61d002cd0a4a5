"""What a new user reads after a common mistake: a model left on the meta device called with a
real input, a forward that returns nothing (issue 42)."""

import pytest
import torch
from torch import nn

import torchlens as tl


def test_a_meta_model_with_a_cpu_input_names_both_devices():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with pytest.raises(tl.MetaDeviceError) as caught:
        tl.log_forward_pass(model, torch.ones(2, 4))
    said = str(caught.value)
    assert "the model's parameters are on the meta device (0.weight" in said and "its input on cpu" in said
    assert "device='meta'" in said and "model.to_empty(device='cpu')" in said
    history = tl.log_forward_pass(model, torch.ones(2, 4), device="meta")  # what it advises works
    assert history.layer_labels == ["input_1_0", "linear_1_1", "relu_1_2", "output_1_3"]


def test_a_forward_that_returns_none_gets_a_note(capsys):
    class NoReturn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            self.fc(x) * 2  # the result is dropped: nothing returned

    history = tl.log_forward_pass(NoReturn(), torch.ones(1, 2), random_seed=0)
    assert history.output_layers == []
    note = next(n for n in history.notes if "return value holds no tensor" in n)
    assert "it returned None" in note and "no output layer" in note
    assert f"Note: {note}" in str(history)
    assert "return value holds no tensor" in capsys.readouterr().err  # said when it happens
    plain = tl.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    assert not any("no output layer" in n for n in plain.notes)
