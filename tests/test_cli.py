"""The command line: models by source, inputs, errors."""

import subprocess
import sys
import textwrap
import time

import pytest

from torchlens.cli import load_model, main, parse_config

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
    assert "Log of TwoLayer forward pass:" in done.stdout
    lines = done.stdout.splitlines()  # print(history) of a small pass: hierarchy and every layer
    assert lines[lines.index("\tModule Hierarchy:") + 1 :][:2] == ["\t\tfc1", "\t\tfc2"]
    assert "\t\t0: input_1_0" in lines and "\t\t1: linear_1_1" in lines


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
        "Log of Tokens forward pass:" in out
        and "1: embedding_1_1" in out
        and "validate_model_activations: passed" in out
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


# ----- hf: and timm: sizes and --config -------------------------------------------------------
def test_hf_families_build_a_small_config_by_default(monkeypatch):
    """hf:llama's default config is 6.7 B parameters: the command line builds a small one."""
    transformers = pytest.importorskip("transformers")
    built = []

    def record(config, **kwargs):
        built.append(config)
        raise RuntimeError("recorded, not built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", record)
    monkeypatch.setattr(transformers.AutoModel, "from_config", record)
    with pytest.raises(RuntimeError, match="recorded"):
        load_model("hf:llama")
    config = built[-1]
    assert config.num_hidden_layers <= 4 and 64 <= config.hidden_size <= 256
    assert config.intermediate_size <= 1024 and config.hidden_size % config.num_attention_heads == 0


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5"])
def test_hf_small_defaults_trace_in_seconds(family, capsys):
    pytest.importorskip("transformers")
    started = time.monotonic()
    assert main([f"hf:{family}", "--input", "1,8"]) == 0
    out = capsys.readouterr().out
    assert "forward pass" in out and "with small defaults where --config sets nothing" in out and "--config" in out
    assert time.monotonic() - started < 60


def test_config_values_reach_the_hf_model():
    pytest.importorskip("transformers")
    model, kind = load_model(
        "hf:llama", config=parse_config("num_hidden_layers=1,hidden_size=32,tie_word_embeddings=true")
    )
    assert kind == "language" and len(model.model.layers) == 1 and model.config.hidden_size == 32
    assert model.config.tie_word_embeddings is True
    assert model.config.num_attention_heads == 4  # the small default, kept where not overridden


def test_config_values_reach_the_timm_model():
    pytest.importorskip("timm")
    model, _ = load_model("timm:resnet18", config={"num_classes": 3})
    assert model.fc.out_features == 3


def test_config_text_is_parsed_to_python_values():
    assert parse_config("a=1,b=0.5,c=true,d=False,e=gelu_new,f=-2,g=1e-5") == {
        "a": 1,
        "b": 0.5,
        "c": True,
        "d": False,
        "e": "gelu_new",
        "f": -2,
        "g": 1e-5,
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["hf:llama", "--config", "num_hidden_layers"], "--config takes KEY=VALUE pairs"),
        (["hf:llama", "--config", "num_hiden_layers=2"], "Did you mean: num_hidden_layers"),
        (["torchvision:resnet18", "--config", "a=1"], "--config is for hf: and timm: models"),
        (["timm:resnet18", "--config", "no_such_option=1"], "no_such_option"),
        (["hf:gpt2", "--config", "n_layer=abc"], "--config: hf:gpt2's config refuses n_layer=abc: "),
    ],
)
def test_bad_config_is_a_usage_error(argv, message, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("timm")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err  # one line, not HF's multi-line validation error


def test_a_model_too_big_for_memory_is_refused_before_it_is_built(monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    import torchlens.cli as cli

    monkeypatch.setattr(cli, "available_memory", lambda: 2 * 1024**3)  # 2 GiB free
    real = transformers.AutoModelForCausalLM.from_config

    def only_on_meta(config, **kwargs):
        import torch

        assert torch.empty(0).device.type == "meta", "built for real before the size check"
        return real(config, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", only_on_meta)
    big = "num_hidden_layers=32,hidden_size=4096,intermediate_size=11008,num_attention_heads=32,num_key_value_heads=32"
    assert main(["hf:llama", "--config", big]) == 2
    said = capsys.readouterr()
    assert "small" not in said.out  # no "small config" line before the refusal
    err = " ".join(said.err.split())
    assert "6.7 billion parameters" in err and "27.0 GB" in err and "2.1 GB" in err
    assert "--config num_hidden_layers=2" in err
