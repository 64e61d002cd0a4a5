"""The command line: models by source, inputs, errors."""
import subprocess
import sys
import textwrap

import pytest

from torchlens.cli import main

MODEL_FILE = textwrap.dedent('''
    import torch
    from torch import nn

    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(10, 4)
            self.fc2 = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))
''')


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


@pytest.mark.parametrize("argv, message", [
    (["torchvision:resnet81"], "Did you mean: resnet18"),
    (["torchvision:resnet18", "--input", "1,x"], "comma-separated integers"),
    (["torchvision:resnet18", "--input", "1,0"], "must be positive"),
    (["nowhere:thing"], "unknown model source"),
    (["resnet18"], "must look like"),
    (["missing.py:Net"], "no such file"),
])
def test_clear_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_class_and_layer(model_file, capsys):
    assert main([f"{model_file}:Nope"]) == 2
    assert "has no attribute 'Nope'" in capsys.readouterr().err
    assert main([f"{model_file}:TwoLayer", "--input", "2,10", "--layer", "conv2d_1_1"]) == 2
    assert "is not a layer label" in capsys.readouterr().err


def test_python_dash_m(model_file):
    done = subprocess.run([sys.executable, "-m", "torchlens", f"{model_file}:TwoLayer", "--input", "1,10"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "linear_2_3" in done.stdout
