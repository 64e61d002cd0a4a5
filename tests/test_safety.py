"""Nothing is left behind: torch, the model, the caller's RNG and threads are as before."""

import gc
import random
import threading
import weakref
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.trace.capture import decorate


def _torch_snapshot():
    namespaces = {id(p.owner): p.owner for p in decorate.wrapper_table().patches}
    return {key: dict(vars(owner)) for key, owner in namespaces.items()}


def _assert_torch_restored(before):
    after = _torch_snapshot()
    for key, attrs in before.items():
        assert set(after[key]) == set(attrs)
        changed = [name for name, value in attrs.items() if after[key][name] is not value]
        assert not changed, f"not restored: {changed[:5]}"
    assert decorate.ACTIVE.tracer is None


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fc2 = nn.Linear(3, 3)

    def forward(self, x):
        x = torch.relu(self.fc(x))
        return self.fc2(x)  # wrong shape: raises inside F.linear


class Mutating(nn.Module):
    """Changes its own flags during forward; torchlens must put them back."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        self.fc.eval()
        self.fc.weight.requires_grad_(False)
        return self.fc(x)


def test_torch_restored_after_normal_and_failing_pass():
    before = _torch_snapshot()
    tl.log_forward_pass(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), torch.rand(2, 3))
    _assert_torch_restored(before)
    with pytest.raises(RuntimeError) as info:
        tl.log_forward_pass(Raises(), torch.rand(2, 4))
    _assert_torch_restored(before)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "while computing 'linear'" in note and "inside module 'fc2'" in note
    assert torch.relu(torch.tensor([-1.0])).item() == 0.0


class _CountingTracer:
    """Stands in for an active tracer: counts the calls that still reach a wrapper."""

    paused = False

    def __init__(self):
        self.thread_id = threading.get_ident()
        self.calls = []

    def on_call(self, func, info, args, kwargs):
        self.calls.append(info.name)
        return func(*args, **kwargs)

    def on_bool(self, tensor):
        self.calls.append("__bool__")


class _TensorMethods(nn.Module):
    def forward(self, a):
        b = a.flip(0)
        out = (a + b, a * 2, a.add(b), a.sum(), a @ b.T, a[0], -a, abs(a), a > 0, bool(a[0, 0] > 2))
        a[0] = b[0]
        return out


def test_no_wrapper_is_reached_after_a_pass():
    """Patched class dicts are written directly (capture/class_dict.py): the interpreter's method
    caches, filled during the pass with the wrappers, must give the originals again."""
    model = _TensorMethods()
    history = tl.log_forward_pass(model, torch.rand(2, 2))
    assert {"add", "mul", "sum", "matmul", "getitem", "neg", "abs", "gt", "setitem"} <= {e.layer_type for e in history}
    counting = _CountingTracer()
    decorate.ACTIVE.tracer = counting
    try:
        for _ in range(3):  # the same call sites, specialised by now
            model(torch.rand(2, 2))
    finally:
        decorate.ACTIVE.tracer = None
    assert counting.calls == []


def test_model_input_error_keeps_type_and_says_what_to_do():
    with pytest.raises(TypeError) as info:
        tl.log_forward_pass(nn.Linear(3, 3), [torch.rand(2, 3), torch.rand(2, 3)])
    assert "check that the inputs" in "\n".join(info.value.__notes__)


def test_model_flags_restored():
    model = Mutating().train()
    tl.log_forward_pass(model, torch.rand(2, 3))
    assert model.fc.training and model.fc.weight.requires_grad


def test_no_attributes_left_on_model_params_or_outputs():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    before = {name: set(vars(m)) for name, m in model.named_modules()}
    forward_before = [m.forward for m in model.modules()]
    h = tl.log_forward_pass(model, torch.rand(2, 3))
    assert {name: set(vars(m)) for name, m in model.named_modules()} == before
    assert [m.forward for m in model.modules()] == forward_before
    for p in model.parameters():
        assert not vars(p)
    assert not vars(h["output_1_3"].activation)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not nn.modules.module._global_forward_hooks
    assert not nn.modules.module._global_forward_pre_hooks


def test_output_unchanged_and_caller_rng_restored():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    x = torch.rand(4, 8)
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(5)
    expected_next = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(5)
    h = tl.log_forward_pass(model, x, random_seed=77)
    assert (
        torch.rand(3).equal(expected_next[0])
        and random.random() == expected_next[1]
        and np.random.rand() == expected_next[2]
    )
    torch.manual_seed(77)
    assert torch.equal(model(x), h["output_1_3"].activation)


def test_other_threads_are_not_logged_or_broken():
    results = {}
    started, release = threading.Event(), threading.Event()

    def worker():
        started.wait(5)
        results["value"] = (torch.ones(2) + 1).sum().item()
        release.set()

    class Waits(nn.Module):
        def forward(self, x):
            y = x * 2
            started.set()
            release.wait(5)
            return y + 1

    thread = threading.Thread(target=worker)
    thread.start()
    h = tl.log_forward_pass(Waits(), torch.ones(3))
    thread.join()
    assert results["value"] == 4.0
    assert h.layer_labels == ["input_1_0", "mul_1_1", "add_1_2", "output_1_3"]


def test_nested_log_forward_pass_raises_clear_error():
    class Nested(nn.Module):
        def forward(self, x):
            tl.log_forward_pass(nn.Linear(2, 2), x)
            return x

    with pytest.raises(RuntimeError, match="already being logged"):
        tl.log_forward_pass(Nested(), torch.ones(1, 2))
    assert decorate.ACTIVE.tracer is None


def test_histories_are_released():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    refs = []
    for _ in range(100):
        h = tl.log_forward_pass(model, torch.rand(2, 3))
        refs.append(weakref.ref(h))
    del h
    gc.collect()
    assert all(r() is None for r in refs)


def test_bad_inputs_get_clear_errors():
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
        tl.log_forward_pass(F.relu, torch.rand(2))
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU())
    with pytest.raises(ValueError, match="Close matches: .*conv2d"):
        tl.log_forward_pass(model, torch.rand(1, 1, 5, 5), layers_to_save=["conv2d_9_9"])
    with pytest.raises(ValueError, match="matches no layer"):
        tl.log_forward_pass(model, torch.rand(1, 1, 5, 5), layers_to_save=["lstm"])
    with pytest.raises(TypeError, match="layers_to_save"):
        tl.log_forward_pass(model, torch.rand(1, 1, 5, 5), layers_to_save=[1.5])


def test_concurrent_passes_from_two_threads_are_serialised():
    import torch._dynamo  # loaded, so each pass switches compiled code to eager and back

    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    results, errors = [], []

    def trace():
        try:
            for _ in range(5):
                results.append(tl.log_forward_pass(model, torch.rand(2, 3)).layer_labels)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=trace) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [["input_1_0", "linear_1_1", "relu_1_2", "output_1_3"]] * 10
    assert decorate.ACTIVE.tracer is None
    # overlapping passes put Dynamo's stance back once, as it was: torch.compile still compiles
    assert torch._dynamo.eval_frame._stance.stance == "default"


def test_lazy_modules_are_created_as_in_a_plain_forward():
    """An uninitialised nn.LazyLinear is created by the traced pass itself: from the caller's
    random streams (not the pass's seed), not logged as operations, reported once created."""

    def make():
        return nn.Sequential(nn.LazyLinear(4), nn.LazyBatchNorm1d(), nn.ReLU()).train()

    x = torch.rand(3, 5)
    torch.manual_seed(0)
    plain = make()
    plain(x)
    for layers_to_save in ("all", ["linear_1_1"]):  # one pass, and two
        torch.manual_seed(0)
        model = make()
        h = tl.log_forward_pass(model, x, layers_to_save=layers_to_save, keep_unsaved_layers=True)
        assert h.layer_labels == [
            "input_1_0",
            "linear_1_1",
            "buffer_1_2",
            "buffer_2_3",
            "batchnorm_1_4",
            "relu_1_5",
            "output_1_6",
        ]
        assert h["linear_1_1"].num_params == 24 and h.num_params == 32
        assert h.param_info["0.weight"][0] == (4, 5) and h.module_types["0"] == "Linear"
        for (key, value), expected in zip(model.state_dict().items(), plain.state_dict().values()):
            assert torch.equal(value, expected), key  # statistics updated once, in either case
        assert not model[0]._forward_pre_hooks and not model[1]._forward_pre_hooks
    torch.manual_seed(0)
    assert tl.validate_model_activations(make(), x, random_seed=1, verbose=True)


class _UsesRelu(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def test_a_torch_function_patched_between_passes_is_neither_hidden_nor_undone():
    """The wrappers are made once per process; a torch function replaced after that (a mock,
    another library's patch) must stay in place during and after the next pass."""
    x = torch.rand(2, 3)
    tl.log_forward_pass(_UsesRelu(), x)  # the wrappers exist now
    real = torch.relu
    calls = []

    def spy(tensor):
        calls.append(tensor.shape)
        return real(tensor)

    with mock.patch("torch.relu", spy):
        tl.log_forward_pass(_UsesRelu(), x)
        assert torch.relu is spy and calls == [x.shape]
    assert torch.relu is real
    history = tl.log_forward_pass(_UsesRelu(), x)
    assert [e.layer_type for e in history] == ["input", "relu", "add", "output"]
