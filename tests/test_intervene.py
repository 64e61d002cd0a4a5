"""Interventions during the pass (intervene=) and after it (history.rerun), each checked against
the model run by hand with a forward hook making the same change."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

import torchlens as tl
from torchlens.trace.render import build_dot
from torchlens.trace.render.style import INTERVENED_BORDER
from torchlens.trace.rerun import RerunError


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def hooked(model: nn.Module, module: nn.Module, fn, x, seed=None):
    """The model's output with ``fn`` applied to ``module``'s output by a forward hook."""
    handle = module.register_forward_hook(lambda m, i, out: fn(out))
    try:
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


class Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.fc(x))
        return x


def double(a, e):
    return a * 2


def test_layer_label_matches_a_forward_hook():
    model, x = mlp(), torch.rand(5, 3)
    seen = []
    h = tl.log_forward_pass(model, x, intervene={"relu_1_2": lambda a, e: seen.append(e.label) or a * 0 + 0.5})
    assert seen == ["relu_1_2"]
    expected = hooked(model, model[1], lambda out: out * 0 + 0.5, x)
    assert torch.equal(h[h.output_layers[0]].activation, expected)
    assert torch.equal(h["relu_1_2"].activation, torch.full((5, 4), 0.5))
    assert (
        h["relu_1_2"].intervened
        == "replaced by intervene['relu_1_2'] (test_layer_label_matches_a_forward_hook.<locals>.<lambda>)"
    )
    assert not h["linear_2_3"].intervened
    assert "Intervened: replaced by intervene['relu_1_2']" in str(h["relu_1_2"])
    table = h.to_pandas()
    assert table.loc[table.label == "relu_1_2", "intervened"].item().startswith("replaced")
    assert table.intervened.notna().sum() == 1
    dot = build_dot(h).source
    assert dot.count(INTERVENED_BORDER) == 1 and "intervened: value replaced" in dot


def test_module_address_matches_a_forward_hook():
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), torch.rand(1, 3, 32, 32)
    h = tl.log_forward_pass(model, x, intervene={"layer1.0": double, "layer3": lambda a, e: -a})
    expected = hooked(model, model.layer1[0], lambda out: out * 2, x)
    handle = model.layer3.register_forward_hook(lambda m, i, out: -out)
    try:
        expected = hooked(model, model.layer1[0], lambda out: out * 2, x)
    finally:
        handle.remove()
    assert torch.allclose(h[h.output_layers[0]].activation, expected, rtol=0, atol=0)
    assert h["layer1.0"].intervened and h["layer3"].intervened
    assert [e.label for e in h if e.intervened] == [h["layer1.0"].label, h["layer3"].label]


def test_a_pass_key_hits_only_that_pass():
    model, x = Loop(), torch.rand(2, 3)
    h = tl.log_forward_pass(model, x, intervene={"tanh_1_2:2": lambda a, e: a + 1})
    calls = []

    def on_second(out):
        calls.append(1)
        return out + 1 if len(calls) == 2 else out

    handle = model.fc.register_forward_hook(lambda m, i, out: None)
    handle.remove()
    # tanh is not a module: compute by hand
    with torch.no_grad():
        y = torch.tanh(model.fc(x))
        y = torch.tanh(model.fc(y)) + 1
        y = torch.tanh(model.fc(y))
    assert torch.equal(h[h.output_layers[0]].activation, y)
    assert [e.label for e in h if e.intervened] == ["tanh_1_2:2"]
    assert torch.equal(h["linear_1_1:2"].activation.detach(), model.fc(torch.tanh(model.fc(x))).detach())


def test_substring_key_hits_every_match_like_layers_to_save():
    model, x = mlp(), torch.rand(5, 3)
    h = tl.log_forward_pass(model, x, intervene={"relu": lambda a, e: a + 1})
    handles = [model[i].register_forward_hook(lambda m, i, out: out + 1) for i in (1, 3)]
    try:
        with torch.no_grad():
            expected = model(x)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(h[h.output_layers[0]].activation, expected)
    assert [e.label for e in h if e.intervened] == ["relu_1_2", "relu_2_4"]


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        torch.relu_(y)  # the model keeps using y itself
        return y * 3


def test_in_place_operation_is_changed_in_place():
    model, x = InPlace(), torch.rand(2, 3)
    h = tl.log_forward_pass(model, x, intervene={"relu": lambda a, e: torch.ones_like(a)})
    assert torch.equal(h[h.output_layers[0]].activation, torch.full((2, 3), 3.0))
    with pytest.raises(ValueError, match="in-place operation.*keep its shape"):
        tl.log_forward_pass(model, x, intervene={"relu": lambda a, e: torch.ones(7)})


def test_the_replacement_can_change_the_shape():
    model = nn.Sequential(nn.Flatten(), nn.ReLU())
    h = tl.log_forward_pass(model, torch.rand(2, 3, 4), intervene={"flatten": lambda a, e: a[:, :5]})
    assert h["relu_1_2"].shape == (2, 5) and h["flatten_1_1"].shape == (2, 5)


def test_gradients_flow_through_the_replacement():
    model, x = mlp(), torch.rand(5, 3)
    h = tl.log_forward_pass(model, x, intervene={"relu_1_2": lambda a, e: a * 0}, save_gradients=True)
    h[h.output_layers[0]].activation.sum().backward()
    assert model[0].weight.grad is None or torch.count_nonzero(model[0].weight.grad) == 0
    assert h["linear_2_3"].gradient is not None


@pytest.mark.parametrize(
    "intervene,error,match",
    [
        ({"relu_9_9": double}, ValueError, r"intervene: 'relu_9_9' matches no layer.*Close matches"),
        ({-100: double}, ValueError, r"intervene: position -100 is out of range"),
        ({"relu_1_2": 3}, TypeError, r"intervene\['relu_1_2'\] must be a function"),
        ([("relu_1_2", double)], TypeError, r"intervene must be a dict"),
        ({"input_1_0": double}, ValueError, r"an input layer; intervene on an operation"),
        ({"relu_1_2": lambda a, e: 1.0}, TypeError, r"returned float for layer relu_1_2; it must return a tensor"),
        ({"relu_1_2": double, "relu": double}, ValueError, r"relu_1_2 is named by two keys"),
    ],
)
def test_bad_interventions_are_refused_clearly(intervene, error, match):
    with pytest.raises(error, match=match):
        tl.log_forward_pass(mlp(), torch.rand(5, 3), intervene=intervene)


@pytest.mark.parametrize("fn", [lambda a: a * 0, lambda: None, lambda a, e, extra: a])
def test_a_function_with_the_wrong_signature_is_named_with_the_expected_one(fn):
    model = mlp()
    with pytest.raises(TypeError) as info:
        tl.log_forward_pass(model, torch.rand(5, 3), intervene={"relu_1_2": fn})
    text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert "intervene['relu_1_2']" in text and "wrong signature" in text and "fn(activation, entry)" in text
    assert "model's own error" not in text


def test_an_error_raised_by_the_intervene_function_is_blamed_on_it():
    def broken(a, e):
        return a.no_such_method()

    for fn, error in ((broken, AttributeError), (lambda a, e: 1.0, TypeError)):
        with pytest.raises(error) as info:
            tl.log_forward_pass(mlp(), torch.rand(5, 3), intervene={"relu_1_2": fn})
        text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
        assert "intervene['relu_1_2']" in text and "relu_1_2" in text
        assert "model's own error" not in text, text


# ----- rerun -----------------------------------------------------------------------------------
def test_rerun_matches_a_forward_hook_and_leaves_the_original():
    model, x = mlp(), torch.rand(5, 3)
    h = tl.log_forward_pass(model, x, save_function_args=True, random_seed=0)
    before = h[h.output_layers[0]].activation.clone()
    new = torch.rand(5, 4)
    changed = h.rerun({"relu_1_2": new})
    expected = hooked(model, model[1], lambda out: new, x)
    assert torch.equal(changed[changed.output_layers[0]].activation, expected)
    assert torch.equal(h[h.output_layers[0]].activation, before)  # the original is unchanged
    assert changed["relu_1_2"].intervened == "replaced by rerun['relu_1_2']" and not h["relu_1_2"].intervened
    assert changed["linear_1_1"].activation is h["linear_1_1"].activation  # upstream is shared, not recomputed
    assert "rerun: relu_1_2 replaced; 4 layers downstream recomputed" in str(changed)


def test_rerun_module_key_and_function_change_matches_intervene():
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), torch.rand(1, 3, 32, 32)
    h = tl.log_forward_pass(model, x, save_function_args=True, random_seed=0)
    changed = h.rerun({"layer2.1": double})
    during = tl.log_forward_pass(model, x, intervene={"layer2.1": double}, random_seed=0)
    expected = hooked(model, model.layer2[1], lambda out: out * 2, x)
    assert torch.allclose(changed[changed.output_layers[0]].activation, expected, rtol=1e-5, atol=1e-6)
    assert torch.allclose(during[during.output_layers[0]].activation, expected, rtol=0, atol=0)


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x)) + torch.rand(4)


def test_rerun_replays_random_operations_with_their_saved_generator_state():
    model, x = Noisy().train(), torch.rand(3, 4)
    h = tl.log_forward_pass(model, x, save_function_args=True, random_seed=7)
    changed = h.rerun({"linear_1_1": lambda a, e: a + 1})
    expected = hooked(model, model.fc, lambda out: out + 1, x, seed=7)
    assert torch.equal(changed[changed.output_layers[0]].activation, expected)


def test_rerun_on_a_loaded_history(tmp_path):
    model, x = mlp(), torch.rand(5, 3)
    h = tl.log_forward_pass(model, x, save_function_args=True, random_seed=0)
    loaded = tl.load(h.save(tmp_path / "h"))
    changed = loaded.rerun({"linear_2_3": torch.zeros(5, 4)})
    expected = hooked(model, model[2], lambda out: torch.zeros(5, 4), x)
    assert torch.equal(changed[changed.output_layers[0]].activation, expected)


class Skip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(torch.relu(h)) + h


def test_rerun_refuses_clearly():
    model, x = mlp(), torch.rand(5, 3)
    plain = tl.log_forward_pass(model, x)
    with pytest.raises(RerunError, match="save_function_args=True"):
        plain.rerun({"relu_1_2": torch.zeros(5, 4)})
    # the sum needs linear_1_1, which is not downstream of the change and was not saved
    subset = tl.log_forward_pass(
        Skip(), x, save_function_args=True, layers_to_save=["relu_1_2"], keep_unsaved_layers=True
    )
    with pytest.raises(RerunError, match="needs the activation of its parent linear_1_1"):
        subset.rerun({"relu_1_2": torch.zeros(5, 3)})
    full = tl.log_forward_pass(model, x, save_function_args=True)
    with pytest.raises(RerunError, match=r"re-running linear_2_3 \(linear\) on the new values failed"):
        full.rerun({"relu_1_2": torch.zeros(5, 7)})
    with pytest.raises(ValueError, match=r"rerun: changes: 'relu_7' matches no layer"):
        full.rerun({"relu_7": torch.zeros(5, 4)})
    with pytest.raises(TypeError, match="non-empty dict"):
        full.rerun({})
