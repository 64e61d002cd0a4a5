"""validate_model_activations: says True for correct logs, False (with the reason) otherwise."""
import pytest
import torch
from torch import nn

import torchlens as tl
import torchlens.validate as validate_module
from models import REGISTRY

# Models that raise on purpose.
EXPECTED_NOT_VALID = {"raises_midway", "raises_in_submodule"}


@pytest.mark.parametrize("name, make_model, make_inputs",
                         [r for r in REGISTRY if r[0] not in EXPECTED_NOT_VALID], ids=lambda v: v if isinstance(v, str) else "")
def test_catalogue_models_validate(name, make_model, make_inputs):
    args, kwargs = make_inputs()
    assert tl.validate_model_activations(make_model(), list(args), kwargs, random_seed=0, verbose=True)


def test_write_through_a_view_is_replayed():
    class ViewWrite(nn.Module):
        def forward(self, x):
            y = torch.zeros(2, 3)
            y[1].copy_(x)
            return y * 2

    h = tl.log_forward_pass(ViewWrite(), torch.rand(3))
    assert h.layer_labels == ["input_1_0", "zeros_1_1", "getitem_1_2", "copy_1_3", "viewwrite_1_4",
                              "mul_1_5", "output_1_6"]
    assert h["viewwrite_1_4"].parent_layers == ["zeros_1_1", "copy_1_3"]
    assert tl.validate_model_activations(ViewWrite(), torch.rand(3), verbose=True)


def test_a_corrupted_activation_is_caught(monkeypatch, capsys):
    real = validate_module.log_forward_pass

    def corrupting(*args, **kwargs):
        history = real(*args, **kwargs)
        history["relu_1_2"].activation.add_(1.0)
        return history

    monkeypatch.setattr(validate_module, "log_forward_pass", corrupting)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    assert not tl.validate_model_activations(model, torch.rand(2, 3), verbose=True)
    assert "relu_1_2" in capsys.readouterr().out


def test_a_fake_edge_is_caught(monkeypatch, capsys):
    """An edge the function does not use (perturbing it changes nothing) is reported."""
    real = validate_module.log_forward_pass

    def with_fake_parent(*args, **kwargs):
        history = real(*args, **kwargs)
        entry = history["relu_1_2"]
        entry.parent_layers = entry.parent_layers + ["input_1_0"]
        return history

    monkeypatch.setattr(validate_module, "log_forward_pass", with_fake_parent)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    assert not tl.validate_model_activations(model, torch.rand(2, 3), verbose=True)
    assert "changing parent input_1_0 does not change the result" in capsys.readouterr().out


def test_model_and_rng_left_as_found():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.3)).train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(5, 4)
    torch.manual_seed(9)
    expected = torch.rand(3)
    torch.manual_seed(9)
    assert tl.validate_model_activations(model, x, random_seed=2)
    assert torch.equal(torch.rand(3), expected)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert model.training


def test_the_old_value_of_an_out_tensor_is_not_a_parent():
    class Out(nn.Module):
        def forward(self, x):
            buf = x * 3
            torch.add(x, 1, out=buf)  # overwrites buf: its old value is not read
            return buf * 2

    h = tl.log_forward_pass(Out(), torch.rand(3), save_function_args=True)
    assert h["add_1_2"].parent_layers == ["input_1_0"]
    assert h["mul_1_1"].child_layers == []
    assert tl.validate_model_activations(Out(), torch.rand(3), verbose=True)


def test_spectral_norm_in_train_mode_validates():
    """spectral_norm's power iteration writes into its u and v buffers with out=."""
    torch.manual_seed(0)
    model = nn.utils.spectral_norm(nn.Linear(4, 3)).train()
    assert tl.validate_model_activations(model, torch.rand(2, 4), random_seed=0, verbose=True)
