"""TorchScript models are refused; torch.compile'd models and submodules are traced eagerly
(torchlens.trace.capture.unwrap)."""

import time
import warnings

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.capture.unwrap import TorchScriptModelError


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


X = torch.rand(2, 3)
no_jit_deprecation = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")


@no_jit_deprecation
def test_torchscript_model_is_refused_with_what_to_do():
    scripted = torch.jit.script(_net())
    with pytest.raises(TypeError, match="Pass the original eager nn.Module") as info:
        tl.log_forward_pass(scripted, X)
    assert isinstance(info.value, TorchScriptModelError) and "torch.jit.script" in str(info.value)


def test_compiled_model_traces_its_original_module_quickly_and_says_so(capsys):
    model = _net()
    eager = tl.log_forward_pass(model, X, random_seed=0)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = tl.log_forward_pass(torch.compile(model), X, random_seed=0)
    assert time.perf_counter() - start < 5  # was 18 s of Dynamo compiling our wrappers
    assert not caught, [str(w.message) for w in caught]  # no Dynamo warnings about torchlens internals
    assert h.layer_labels == eager.layer_labels and h.model_name == "Sequential"
    assert torch.equal(h["output"].activation, eager["output"].activation)
    assert h.notes and "model._orig_mod" in h.notes[0]
    assert f"Note: {h.notes[0]}" in str(h)
    assert "torchlens: note: torch.compile" in capsys.readouterr().err


@no_jit_deprecation
def test_compiled_and_scripted_submodules():
    model = nn.Sequential(torch.compile(nn.Linear(3, 3)), nn.ReLU())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = tl.log_forward_pass(model, X)
    assert not caught, [str(w.message) for w in caught]
    assert [e.layer_type for e in h] == ["input", "linear", "relu", "output"]
    assert len(h.notes) == 1 and "compiled submodules (0)" in h.notes[0]
    mixed = nn.Sequential(torch.jit.script(nn.Linear(3, 3)), nn.ReLU())
    h = tl.log_forward_pass(mixed, X)
    assert len(h.notes) == 1 and "TorchScript submodules (0)" in h.notes[0]


class _WithScripted(nn.Module):
    """A TorchScript submodule holding buffers that a training-mode forward updates."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pre = nn.Linear(3, 3)
        self.sub = torch.jit.script(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))

    def forward(self, x):
        return self.sub(self.pre(x)) * 2


@no_jit_deprecation
def test_a_scripted_submodule_is_one_untraced_node_fed_by_its_input():
    h = tl.log_forward_pass(_WithScripted(), X, random_seed=0)
    assert [e.layer_type for e in h] == ["input", "linear", "untraced", "mul", "output"]  # no identity after it
    gap = h[h.untraced_layers[0]]
    assert gap.parent_layers == ["linear_1_1"]  # what the submodule was given
    assert gap.containing_module == "sub" and h["sub"] is gap
    assert h["mul_1_3"].parent_layers == [gap.label]


@no_jit_deprecation
def test_validating_a_model_with_a_scripted_submodule_names_the_gap_and_restores_its_buffers(capsys):
    model = _WithScripted().train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    assert tl.validate_model_activations(model, X, random_seed=0, verbose=True) is False
    assert "untraced producer inside module 'sub'" in capsys.readouterr().out
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)  # running statistics too


def test_compiled_submodules_and_functions_are_named_in_notes_and_keep_their_addresses(capsys):
    def doubled_sine(x):
        return torch.sin(x) * 2

    class Compiled(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.pre = nn.Linear(3, 3)
            self.sub = torch.compile(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
            self.twice = torch.compile(doubled_sine)

        def forward(self, x):
            return self.twice(self.sub(self.pre(x)))

    model = Compiled()
    h = tl.log_forward_pass(model, X, random_seed=0, layers_to_save=["sub.0"])
    assert h.modules.addresses == ["pre", "sub", "sub.0", "sub.1"]  # no sub._orig_mod level
    assert h.modules.types["sub"] == "Sequential" and h["sub.0"].layer_type == "linear"
    assert h["sub.0"].activation is not None  # the address a user writes, as layers_to_save
    compiled_modules, compiled_functions = (
        next(n for n in h.notes if what in n) for what in ("compiled submodules", "compiled functions")
    )
    assert "(sub)" in compiled_modules and "eagerly" in compiled_modules
    assert "doubled_sine" in compiled_functions and "eagerly" in compiled_functions
    assert "torchlens: note: torch.compile: compiled functions (" in capsys.readouterr().err
    assert tl.validate_model_activations(model, X, random_seed=0)


def test_functions_dynamo_only_disables_are_not_called_compiled():
    import torch._dynamo  # noqa: F401 - loaded, as torch.utils.checkpoint loads it
    import torch.utils.checkpoint

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):  # checkpoint is wrapped by torch._disable_dynamo: nothing compiled
            return torch.utils.checkpoint.checkpoint(self.lin, x, use_reentrant=False).relu()

    h = tl.log_forward_pass(Checkpointed(), X, random_seed=0)
    assert "linear" in [e.layer_type for e in h] and not any("compiled" in note for note in h.notes), h.notes
