"""Options of log_forward_pass and the ModelHistory views users rely on."""

import re
import warnings

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.records.tensor_log import ParentRef


class CountingNet(nn.Module):
    """Counts its forward calls, to tell one-pass from two-pass requests."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.conv = nn.Conv2d(1, 2, 3)
        self.block = nn.Sequential(nn.ReLU(), nn.Conv2d(2, 2, 3))
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        self.calls += 1
        x = self.block(self.conv(x))
        x = x.mean(dim=(2, 3))
        return self.fc(x)


@pytest.fixture
def net():
    torch.manual_seed(0)
    return CountingNet()


X = torch.rand(1, 1, 7, 7)


@pytest.mark.parametrize(
    "request_keys, passes, labels",
    [
        (["conv2d"], 1, ["conv2d_1_1", "conv2d_2_3"]),
        (["conv"], 1, ["conv2d_1_1"]),  # a module address wins over a substring
        (["block"], 1, ["conv2d_2_3"]),
        (["block.0", "fc"], 1, ["relu_1_2", "linear_1_5"]),
        (["conv2d_2_3"], 2, ["conv2d_2_3"]),
        ([-2, 1], 2, ["conv2d_1_1", "linear_1_5"]),
        (["relu_1:1"], 2, ["relu_1_2"]),
    ],
)
def test_layers_to_save_forms_and_number_of_passes(net, request_keys, passes, labels):
    h = tl.log_forward_pass(net, X, layers_to_save=request_keys)
    assert net.calls == passes
    assert h.layer_labels == labels
    assert all(e.activation is not None for e in h)


class DictOut(nn.Module):
    """forward(x) returns a dict; a top-level buffer and a recurrent layer give every key form."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        self.calls += 1
        y = self.bn(self.fc(x)) * self.scale
        for _ in range(2):
            y = torch.tanh(y)
        return {"logits": y, "loss": y.sum()}


@pytest.mark.parametrize(
    "request_keys, labels",
    [
        (["input.x"], ["input_1_0"]),
        (["output.logits", "output.loss"], ["output_1_9", "output_2_10"]),
        (["scale", "bn.running_mean"], ["buffer_1_2", "buffer_3_5"]),
    ],
)
def test_input_output_and_buffer_addresses_are_saved_in_one_pass(request_keys, labels):
    model = DictOut()
    h = tl.log_forward_pass(model, torch.rand(4, 3), layers_to_save=request_keys)
    assert model.calls == 1
    assert h.layer_labels == labels
    assert all(h[key].activation is not None for key in request_keys)


def test_every_history_key_works_in_layers_to_save():
    model, x = DictOut(), torch.rand(4, 3)
    full = tl.log_forward_pass(model, x, random_seed=0)
    keys = {key for e in full for key in e.lookup_keys}
    assert {"input.x", "output.logits", "scale", "fc", "tanh_1_7:2", -1} <= keys
    for key in keys:
        h = tl.log_forward_pass(model, x, layers_to_save=[key], random_seed=0)
        label = full[key].label
        assert label in h.layer_labels and h[label].activation is not None, key
    with pytest.raises(ValueError, match="input.x"):
        tl.log_forward_pass(model, x, layers_to_save=["input.y"])


class OutputModule(nn.Module):
    """A top-level module named ``output``: its address is also the model output's."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.output = nn.Linear(3, 2)

    def forward(self, x):
        return self.output(torch.relu(self.fc(x)))


def test_a_key_naming_a_module_and_the_output_saves_what_history_gives():
    model, x = OutputModule(), torch.rand(1, 3)
    full = tl.log_forward_pass(model, x, random_seed=0)
    for key in ("output", "output:1", -1):
        h = tl.log_forward_pass(model, x, layers_to_save=[key], random_seed=0)
        assert h.layer_labels == [full[key].label], key


def test_keep_unsaved_layers(net):
    h = tl.log_forward_pass(net, X, layers_to_save=["fc"], keep_unsaved_layers=True)
    assert len(h) == 7
    assert [e.label for e in h if e.activation is not None] == ["linear_1_5"]
    short = tl.log_forward_pass(net, X, layers_to_save=["fc"])
    with pytest.raises(KeyError, match="keep_unsaved_layers=True"):
        short["conv2d_1_1"]


def test_metadata_only(net):
    h = tl.get_model_metadata(net, X)
    assert len(h) == 7 and all(e.activation is None for e in h)
    assert h["conv2d_1_1"].shape == (1, 2, 5, 5)
    assert h.num_tensors_saved == 0 and h.tensor_bytes > 0
    for empty in (None, "none", []):
        assert all(e.activation is None for e in tl.log_forward_pass(net, X, layers_to_save=empty))


def test_postfunc_device_and_detach(net):
    h = tl.log_forward_pass(net, X, activation_postfunc=lambda t: t.sum(), output_device="cpu")
    assert h["conv2d_1_1"].activation.shape == ()
    assert h.layer_labels[-1] == "output_1_6"
    attached = tl.log_forward_pass(net, X)
    assert attached["linear_1_5"].activation.requires_grad
    detached = tl.log_forward_pass(net, X, detach_saved_tensors=True)
    assert not detached["linear_1_5"].activation.requires_grad
    with pytest.raises(ValueError, match="output_device takes a device"):
        tl.log_forward_pass(net, X, output_device="nonsense")


def test_save_function_args_allow_rerunning_an_operation(net):
    h = tl.log_forward_pass(net, X, save_function_args=True)
    e = h["conv2d_2_3"]
    args = [h[a.label].activation if isinstance(a, ParentRef) else a for a in e.func_args]
    assert isinstance(e.func_args[0], ParentRef) and e.func_args[0].label == "relu_1_2"
    assert torch.allclose(e.func(*args, **e.func_kwargs), e.activation)


def test_random_seed_reproduces_dropout():
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).train()
    x = torch.rand(2, 16)
    a = tl.log_forward_pass(model, x, random_seed=3)
    b = tl.log_forward_pass(model, x, random_seed=3)
    c = tl.log_forward_pass(model, x, random_seed=4)
    assert a.random_seed == 3
    assert torch.equal(a["dropout_1_2"].activation, b["dropout_1_2"].activation)
    assert not torch.equal(a["dropout_1_2"].activation, c["dropout_1_2"].activation)
    again = tl.log_forward_pass(model, x, random_seed=a.random_seed)
    assert torch.equal(again["output_1_3"].activation, a["output_1_3"].activation)


def test_history_views(net):
    h = tl.log_forward_pass(net, X)
    assert h.input_layers == ["input_1_0"] and h.output_layers == ["output_1_6"]
    assert h.module_addresses == ["conv", "block", "block.0", "block.1", "fc"]
    assert h.module_types["block"] == "Sequential" and h.module_passes["fc"] == 1
    assert h.num_params == sum(p.numel() for p in net.parameters())
    assert h.num_param_operations == 3
    assert [e.label for e in h] == h.layer_labels and len(h) == 7
    assert h["input.x"].label == "input_1_0" and h["output"].label == "output_1_6"
    assert h["block"].label == "conv2d_2_3"
    assert h["conv2d_2_3"].containing_modules == ["block:1", "block.1:1"]
    assert h["conv2d_2_3"].modules_output_of == ["block.1:1", "block:1"]
    with pytest.raises(KeyError, match="Did you mean: conv2d_1_1"):
        h["conv2d_1_2"]
    with pytest.raises(KeyError, match="out of range"):
        h[40]


def test_to_pandas(net):
    frame = tl.log_forward_pass(net, X).to_pandas()
    assert list(frame["label"]) == [
        "input_1_0",
        "conv2d_1_1",
        "relu_1_2",
        "conv2d_2_3",
        "mean_1_4",
        "linear_1_5",
        "output_1_6",
    ]
    assert frame.loc[1, "num_params"] == 2 * 9 + 2
    assert frame.loc[3, "containing_module"] == "block.1"


def test_printing_sparse_and_non_tensor_saved_values():
    class Sparse(nn.Module):
        def forward(self, x):
            return (x * 2).to_sparse()

    h = tl.log_forward_pass(Sparse(), torch.eye(3))
    text = str(h["tosparse_1_2"])
    assert "sparse_coo tensor with 3 stored values: tensor([2., 2., 2.])" in text
    assert "sparse_coo tensor with 3 stored values" in repr(h["output"])
    assert "4 tensors" in str(h)
    model = nn.Linear(3, 2)
    shapes = tl.log_forward_pass(model, torch.rand(4, 3), activation_postfunc=lambda t: t.shape)
    assert "Size: torch.Size([4, 2])" in str(shapes["linear_1_1"]) and str(shapes)
    means = tl.log_forward_pass(model, torch.rand(4, 3), activation_postfunc=lambda t: t.mean().item())
    assert "float: " in repr(means["linear_1_1"]) and str(means)


def test_summary_of_a_subset_describes_the_whole_pass(net):
    full = tl.log_forward_pass(net, X, random_seed=0)
    h = tl.log_forward_pass(net, X, layers_to_save=["fc"], random_seed=0)
    assert len(h) == 1 and h.num_tensors == len(full) == 7
    assert h.tensor_bytes == full.tensor_bytes and h.num_param_operations == full.num_param_operations == 3
    text = str(h)
    assert (
        f"7 tensors ({tl.trace.records.format.human_bytes(full.tensor_bytes)}) computed in forward pass; 1 tensors"
        in text
    )
    assert "used by 3 operations" in text and "Layers (1 of 7 kept: the saved ones" in text  # small: every layer
    assert "1 of 7 layers kept" in h.summary()
    assert "Layer linear_1_5, operation 6/7:" in str(h["linear_1_5"])  # its place in the pass, as in full


def test_operation_num_is_the_printed_one_based_position(net):
    h = tl.log_forward_pass(net, X)
    frame = h.to_pandas()
    assert list(frame["operation_num"]) == list(range(1, 8))
    for e, number in zip(h, frame["operation_num"]):
        assert str(e).startswith(f"Layer {e.label}, operation {number}/7:")


def test_slices_and_numpy_integers_as_keys(net):
    np = pytest.importorskip("numpy")
    h = tl.log_forward_pass(net, X, random_seed=0)
    assert [e.label for e in h[2:5]] == h.layer_labels[2:5] and h[::-3] == h.layer_list[::-3]
    assert h[np.int64(3)] is h[3] and h[np.int32(-1)] is h[-1] and np.int64(2) in h
    assert h[torch.tensor(1)] is h[1]
    with pytest.raises(TypeError, match="ints or slices"):
        h[1.0]
    with pytest.raises(TypeError):
        h[np.bool_(True)]
    assert True not in h and 1.5 not in h
    saved = tl.log_forward_pass(net, X, layers_to_save=[np.int64(1), "fc"], random_seed=0)
    assert saved.layer_labels == ["conv2d_1_1", "linear_1_5"]
    assert tl.log_forward_pass(net, X, layers_to_save=np.int64(-2), random_seed=0).layer_labels == ["linear_1_5"]


def test_raising_activation_postfunc_gets_a_note_naming_the_layer(net):
    def only_flat(t):
        if t.dim() == 4 and t.shape[1] == 2:  # the first conv's output (the input has 1 channel)
            raise ValueError("cannot summarise 4-d tensors")
        return t.mean()

    with pytest.raises(ValueError, match="cannot summarise") as info:  # the function's own error type
        tl.log_forward_pass(net, X, activation_postfunc=only_flat)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "activation_postfunc" in notes and "only_flat" in notes
    assert "layer 'conv2d' (operation #2 of the pass, inside module 'conv'" in notes
    assert "shape (1, 2, 5, 5)" in notes and "model's own error" not in notes
    assert tl.log_forward_pass(net, X, activation_postfunc=lambda t: t.sum())["conv2d_1_1"].activation.dim() == 0


def test_detached_copies_and_gradients_are_refused_before_the_pass(net):
    with pytest.raises(ValueError, match="detach_saved_tensors=True and save_gradients=True cannot be combined"):
        tl.log_forward_pass(net, X, detach_saved_tensors=True, save_gradients=True)
    assert net.calls == 0  # refused up front: the model did not run


class TwiceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(self.fc(x)).relu()


def test_a_pass_a_module_or_layer_does_not_have_says_how_many_it_has(net):
    h = tl.log_forward_pass(net, X)
    for key, named in (("fc:2", "'fc'"), ("linear_1_5:2", "'linear_1_5'"), ("linear_1:3", "'linear_1'")):
        with pytest.raises(KeyError) as info:
            h[key]
        message = str(info.value)
        assert "1 pass" in message and named in message and "not saved" not in message, message
    twice = tl.log_forward_pass(TwiceNet(), torch.ones(1, 2), layers_to_save=["relu"])
    for key, valid in (("fc:3", "'fc:2'"), ("linear_1_1:3", "'linear_1_1:2'"), ("fc:0", "'fc:1'")):
        with pytest.raises(KeyError) as info:
            twice[key]
        assert "2 passes" in str(info.value) and valid in str(info.value), str(info.value)
    with pytest.raises(KeyError, match="keep_unsaved_layers=True"):
        twice["fc:2"]  # a pass it has, not kept: the existing advice


@pytest.mark.parametrize("bad", [[1], ("mask", 1), 3])
def test_input_kwargs_that_are_not_a_dict_are_named(bad):
    for call in (tl.log_forward_pass, tl.validate_model_activations):
        with pytest.raises(TypeError, match=r"input_kwargs must be a dict of keyword arguments") as info:
            call(nn.Linear(2, 2), torch.ones(1, 2), input_kwargs=bad)
        assert type(bad).__name__ in str(info.value)


def test_a_module_class_instead_of_an_instance_says_to_pass_an_instance():
    for call in (tl.log_forward_pass, tl.get_model_metadata, tl.validate_model_activations):
        with pytest.raises(TypeError, match=r"the class Linear.*an instance.*Linear\(\.\.\.\)") as info:
            call(nn.Linear, torch.ones(1, 2))
        assert "plain function" not in str(info.value)


@pytest.mark.parametrize("not_a_model", [5, "resnet18", lambda x: x * 2])
def test_every_entry_point_refuses_what_is_not_a_model_by_name(not_a_model, tmp_path):
    """validate_model_activations(5, x) raised AttributeError from inside; each public entry point
    now says which argument is wrong, what it got and what to pass."""
    calls = {
        "log_forward_pass": lambda: tl.log_forward_pass(not_a_model, torch.ones(1, 2)),
        "get_model_metadata": lambda: tl.get_model_metadata(not_a_model, torch.ones(1, 2)),
        "validate_model_activations": lambda: tl.validate_model_activations(not_a_model, torch.ones(1, 2)),
        "show_model_graph": lambda: tl.show_model_graph(
            not_a_model, torch.ones(1, 2), vis_outpath=str(tmp_path / "g"), vis_save_only=True
        ),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{name} expects a torch.nn.Module"), message
        assert type(not_a_model).__name__ in message and "forward" in message


# ----- a warning before saved activations outgrow free memory (capture/memory.py) ------------------
@pytest.fixture
def little_memory(monkeypatch):
    """Pretend the machine has 100 bytes free on every device."""
    monkeypatch.setattr(tl.trace.capture.memory, "free_memory", lambda device: 100)


def test_a_single_pass_warns_when_saved_activations_pass_free_memory(net, little_memory):
    with pytest.warns(tl.ActivationMemoryWarning) as caught:
        h = tl.log_forward_pass(net, X)
    assert len(caught) == 1  # once per pass, not once per activation
    message = str(caught[0].message)
    assert "100 B that was free" in message and "save_to=" in message and "layers_to_save" in message
    # what was saved when it warned: past the 100 B free, and no more than the whole pass saved
    held = re.search(r"hold ([\d.]+) (B|KB) on", message)
    assert held is not None, message
    saved = float(held.group(1)) * (1024 if held.group(2) == "KB" else 1)
    assert 100 < saved <= sum(e.nbytes for e in h.layer_list)
    assert h.layer_labels[-1] == "output_1_6"  # a warning: the pass goes on


def test_a_two_pass_call_warns_before_the_saving_pass(net, little_memory):
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ActivationMemoryWarning)
        with pytest.raises(tl.ActivationMemoryWarning, match=r"will save about .* first, metadata-only pass") as info:
            tl.log_forward_pass(net, X, layers_to_save=["conv2d_1_1", "linear_1_5"])
    assert net.calls == 1  # raised before the second pass ran
    saved = sum(tl.get_model_metadata(net, X)[k].nbytes for k in ("conv2d_1_1", "linear_1_5"))
    assert f"{saved} B" in str(info.value)


def test_a_memory_warning_made_an_error_is_not_blamed_on_the_model(net, little_memory):
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ActivationMemoryWarning)
        with pytest.raises(tl.ActivationMemoryWarning) as info:
            tl.log_forward_pass(net, X)
    assert not any("model's own error" in note for note in getattr(info.value, "__notes__", []))
    assert torch.relu is torch._C._VariableFunctions.relu  # torch restored


def test_no_memory_warning_when_activations_go_to_disk_or_nothing_is_saved(net, little_memory, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ActivationMemoryWarning)
        tl.log_forward_pass(net, X, save_to=tmp_path / "run")
        tl.get_model_metadata(net, X)


def test_free_memory_is_read_by_passes_that_save_and_only_by_them(net, monkeypatch):
    reads = []
    monkeypatch.setattr(tl.trace.capture.memory, "free_memory", lambda device: reads.append(device) or 1 << 40)
    tl.log_forward_pass(net, X, layers_to_save=None)
    assert reads == []  # nothing saved: nothing to check against
    tl.log_forward_pass(net, X)
    assert reads == [torch.device("cpu")]  # once, when the saving pass starts


def test_free_memory_is_read():
    free = tl.trace.capture.memory.free_memory(torch.device("cpu"))
    assert free is None or free > 0
