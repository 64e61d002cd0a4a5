"""The command line: models by source, inputs, errors."""

import subprocess
import sys
import textwrap

import pytest

from torchlens.cli import main

MODEL_FILE = textwrap.dedent("""
    import torch
    from torch import nn

    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(10, 4)
            self.fc2 = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))
""")


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(MODEL_FILE)
    return path


def test_file_model_summary_layer_and_validate(model_file, capsys):
    assert main([f"{model_file}:TwoLayer", "--input", "2,10", "--layer", "relu_1_2", "--validate"]) == 0
    out = capsys.readouterr().out
    assert "Log of TwoLayer forward pass:" in out
    assert "Layer relu_1_2, operation 3/5:" in out
    assert "validate_model_activations: passed" in out


def test_torchvision_model(capsys):
    assert main(["torchvision:squeezenet1_1", "--input", "1,3,48,48"]) == 0
    assert "Log of SqueezeNet forward pass:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["torchvision:resnet81"], "Did you mean: resnet18"),
        (["torchvision:resnet18", "--input", "1,x"], "comma-separated integers"),
        (["torchvision:resnet18", "--input", "1,0"], "must be positive"),
        (["nowhere:thing"], "unknown model source"),
        (["resnet18"], "must look like"),
        (["missing.py:Net"], "no such file"),
    ],
)
def test_clear_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_class_and_layer(model_file, capsys):
    assert main([f"{model_file}:Nope"]) == 2
    assert "has no attribute 'Nope'" in capsys.readouterr().err
    assert main([f"{model_file}:TwoLayer", "--input", "2,10", "--layer", "conv2d_1_1"]) == 2
    assert "is not a layer label" in capsys.readouterr().err


def test_python_dash_m(model_file):
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", f"{model_file}:TwoLayer", "--input", "1,10"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "linear_2_3" in done.stdout


MORE_MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 4)
            self.fc = nn.Linear(4, 2)

        def forward(self, ids):
            return self.fc(self.emb(ids))

    instance = nn.Sequential(nn.Linear(10, 3), nn.ReLU())

    def build():
        return Tokens()

    def broken():
        raise RuntimeError("cannot build")

    class Fails(nn.Module):
        def forward(self, x):
            return x @ torch.ones(3, 3)  # wrong inner size for a 2x10 input

    not_a_model = 3
""")


@pytest.fixture
def more_models(tmp_path):
    path = tmp_path / "more.py"
    path.write_text(MORE_MODELS)
    return path


def test_module_instances_and_functions_returning_modules(more_models, capsys):
    assert main([f"{more_models}:instance", "--input", "2,10"]) == 0
    assert "Log of Sequential forward pass:" in capsys.readouterr().out
    assert main([f"{more_models}:build", "--input", "2,5", "--dtype", "long", "--validate"]) == 0
    out = capsys.readouterr().out
    assert (
        "Log of Tokens forward pass:" in out and "\nemb " in out and "validate_model_activations: passed" in out
    )
    assert main([f"{more_models}:not_a_model"]) == 2
    assert "is a int, not a torch.nn.Module" in capsys.readouterr().err
    assert main([f"{more_models}:broken"]) == 1
    err = capsys.readouterr().err
    assert "building" in err and "RuntimeError: cannot build" in err and "Traceback" not in err


def test_integer_inputs_follow_the_embedding_size(more_models, capsys):
    assert main([f"{more_models}:Tokens", "--input", "3,4", "--dtype", "long", "--layer", "input_1_0"]) == 0
    assert "dtype=torch.int64" in capsys.readouterr().out
    assert main(["torchvision:resnet18", "--dtype", "long"]) == 2
    assert "--dtype is for file models" in capsys.readouterr().err


def test_model_errors_are_printed_cleanly_with_the_note(more_models, capsys):
    assert main([f"{more_models}:Fails", "--input", "2,10"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RuntimeError" in err
    assert "torchlens: Fails raised RuntimeError while computing" in err  # torchlens's note, kept
    assert "--traceback" in err
    assert main([f"{more_models}:Fails", "--input", "2,10", "--traceback"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_unknown_output_extension_is_refused_before_tracing(model_file, capsys, monkeypatch):
    import torchlens as tl

    def never(*args, **kwargs):
        raise AssertionError("traced before checking -o")

    monkeypatch.setattr(tl, "log_forward_pass", never)
    assert main([f"{model_file}:TwoLayer", "--input", "2,10", "-o", "graph.jpeg"]) == 2
    assert "-o must end in .svg, .png, .pdf or .html, not '.jpeg'" in capsys.readouterr().err


def test_html_output_writes_the_interactive_page(model_file, tmp_path, capsys):
    out = tmp_path / "graph.html"
    assert main([f"{model_file}:TwoLayer", "--input", "2,10", "-o", str(out)]) == 0
    assert f"Interactive graph written to {out}" in capsys.readouterr().out
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "relu_1_2" in page and 'src="/assets' not in page
