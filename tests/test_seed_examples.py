"""The examples users read first (the spec's AlexNet and recurrent examples), exactly."""

import pytest
import torch
import torchvision

import torchlens as tl
from examples.models import SimpleRecurrent

ALEXNET_LABELS = (
    "input_1_0 conv2d_1_1 relu_1_2 maxpool2d_1_3 conv2d_2_4 relu_2_5 maxpool2d_2_6 conv2d_3_7 "
    "relu_3_8 conv2d_4_9 relu_4_10 conv2d_5_11 relu_5_12 maxpool2d_3_13 adaptiveavgpool2d_1_14 "
    "flatten_1_15 dropout_1_16 linear_1_17 relu_6_18 dropout_2_19 linear_2_20 relu_7_21 "
    "linear_3_22 output_1_23"
).split()


@pytest.fixture(scope="module")
def alexnet():
    torch.manual_seed(0)
    return torchvision.models.alexnet(weights=None)


@pytest.fixture(scope="module")
def alexnet_history(alexnet):
    return tl.log_forward_pass(alexnet, torch.rand(1, 3, 224, 224), random_seed=1)


def test_alexnet_labels(alexnet_history):
    assert alexnet_history.layer_labels == ALEXNET_LABELS


def test_alexnet_summary_shape(alexnet_history):
    text = str(alexnet_history)
    assert text.startswith("Log of AlexNet forward pass:\n")
    assert "Model structure: purely feedforward, without branching; 23 total modules." in text
    assert "24 tensors (4.8 MB) computed in forward pass; 24 tensors (4.8 MB) saved." in text
    assert "61100840 params total" in text
    assert "Random seed: 1" in text
    # the seed's listing for a small pass: the module hierarchy, then every layer numbered
    lines = text.splitlines()
    hierarchy, layers = lines.index("\tModule Hierarchy:"), lines.index("\tLayers:")
    assert hierarchy < layers
    assert [line.strip() for line in lines[hierarchy + 1 : layers] if not line.startswith("\t\t    ")] == [
        "features:",
        "avgpool",
        "classifier:",
    ]
    assert "features.0, features.1" in text and "classifier.6" in text
    assert [line.strip() for line in lines[layers + 1 :]] == [f"{i}: {label}" for i, label in enumerate(ALEXNET_LABELS)]
    top = alexnet_history.summary(depth=1)
    assert [line.split()[0] for line in top.splitlines() if line[:1].isalpha()][-3:] == [
        "features",
        "avgpool",
        "classifier",
    ]
    assert top.endswith("20 deeper modules not shown: history.summary() shows all.")


def test_alexnet_full_layer_listing(alexnet_history, capsys):
    alexnet_history.print_layers()
    text = capsys.readouterr().out
    assert text.startswith("Log of AlexNet forward pass:\n")
    assert "\t\tfeatures:\n\t\t    features.0, features.1," in text
    assert "\t\t7: conv2d_3_7\n" in text and text.endswith("23: output_1_23\n")


def test_alexnet_entry_print_and_lookup(alexnet_history):
    entry = alexnet_history["conv2d_3_7"]
    for key in ("conv2d_3", "conv2d_3_7:1", "conv2d_3:1", "features.6", "features.6:1", 7, -17):
        assert alexnet_history[key] is entry
    text = str(entry)
    assert text.startswith("Layer conv2d_3_7, operation 8/24:\n")
    assert "Output tensor: shape=(1, 384, 13, 13), dtype=torch.float32, size=253.5 KB" in text
    assert "663936 params total (2.5 MB)" in text
    assert "Parent Layers: maxpool2d_2_6" in text and "Child Layers: relu_3_8" in text
    assert "Function: conv2d (grad_fn=ConvolutionBackward0)" in text
    assert "Computed inside module: features.6" in text
    assert "Output of bottom-level module: features.6" in text
    assert text.endswith("Lookup keys: -17, 7, conv2d_3_7, conv2d_3_7:1, features.6, features.6:1")
    assert alexnet_history["features"].label == "maxpool2d_3_13"


def test_alexnet_activation_matches_recomputation(alexnet, alexnet_history):
    h = alexnet_history
    x = h["input_1_0"].activation
    with torch.no_grad():
        expected = alexnet.features[:7](x)
    assert torch.allclose(h["conv2d_3_7"].activation, expected, atol=1e-5)


def test_alexnet_layers_to_save_example(alexnet):
    h = tl.log_forward_pass(
        alexnet, torch.rand(1, 3, 224, 224), layers_to_save=["conv2d_3_7", "features", -5, "linear"]
    )
    assert h.layer_labels == [
        "conv2d_3_7",
        "maxpool2d_3_13",
        "linear_1_17",
        "dropout_2_19",
        "linear_2_20",
        "linear_3_22",
    ]
    assert all(e.activation is not None for e in h)


def test_alexnet_func_call_stack(alexnet_history):
    stack = alexnet_history["conv2d_3"].func_call_stack
    top = stack[0]
    assert top.file.endswith("torchvision/models/alexnet.py")
    assert top.function == "forward" and top.code_line == "x = self.features(x)"
    assert stack[-1].code_line.startswith("return self._conv_forward") or "conv2d" in stack[-1].code_line
    text = repr(alexnet_history["linear_3_22"].func_call_stack[0])
    assert text.startswith("FuncCallLocation:\n  file: ")
    assert "\n  function: forward\n  code:\n" in text
    assert "--->  x = self.classifier(x)" in text


def test_recurrent_example_passes():
    model = SimpleRecurrent()
    x = torch.rand(6, 5)
    h = tl.log_forward_pass(model, x)
    assert [h[f"linear_1_1:{p}"].pass_num for p in range(1, 5)] == [1, 2, 3, 4]
    assert h["linear_1_1:2"].num_passes == 4
    with torch.no_grad():
        first = (model.fc(x) + 1) * 2
        second = model.fc(first)
    assert torch.allclose(h["linear_1_1:2"].activation, second)
    assert h["fc:2"] is h["linear_1_1:2"]
    assert h.is_recurrent and h.max_passes == 4
    with pytest.raises(KeyError, match="4 passes"):
        h["linear_1_1"]
