"""``python -m torchlens`` / ``torchlens``: trace a model from the shell.

Examples:
    torchlens torchvision:resnet18 --input 1,3,224,224 -o resnet.svg --depth 2
    torchlens hf:gpt2 --input 1,16 --validate
    torchlens hf:llama --config num_hidden_layers=4,hidden_size=128   # hf: configs are small by default
    torchlens timm:convmixer_768_32 --input 1,3,64,64
    torchlens path/to/model.py:MyNet --input 2,10 --rolled -o net.pdf
    torchlens path/to/lm.py:build_model --input 1,12 --dtype long   # a function returning a module
    torchlens explore torchlens_runs/ --port 8080      # the explorer page of watched runs
    torchlens explore RUN_DIR --export page.html       # one self-contained file
    torchlens runs torchlens_runs/                     # the runs of a folder, a line each
    torchlens runs torchlens_runs/ --sql "SELECT run, count(*) FROM series GROUP BY run"
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .errors import TorchlensError
from .machine import available_memory


class CliError(TorchlensError):
    """A problem with what was asked on the command line (printed without a traceback)."""


class ModelError(TorchlensError):
    """The user's model (or its file) raised: printed as one message with its notes, exit code 1."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(what)
        self.what = what
        self.error = error


def _require(package: str, extra: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise CliError(f"'{package}' is needed for {extra} models: pip install {package}") from error


def _torchvision_model(name: str) -> nn.Module:
    torchvision = _require("torchvision", "torchvision:")
    available = torchvision.models.list_models()
    if name not in available:
        import difflib

        close = difflib.get_close_matches(name, available, n=5)
        raise CliError(
            f"unknown torchvision model '{name}'." + (f" Did you mean: {', '.join(close)}?" if close else "")
        )
    return torchvision.models.get_model(name, weights=None)


def _timm_model(name: str, config: Dict[str, Any]) -> nn.Module:
    timm = _require("timm", "timm:")

    def build() -> nn.Module:
        try:
            return timm.create_model(name, pretrained=False, **config)
        except TypeError as error:  # an option the model's constructor does not take
            raise CliError(f"timm:{name} does not take --config {', '.join(config)}: {error}") from error
        except RuntimeError as error:
            if "nknown model" not in str(error):
                raise
            raise CliError(f"unknown timm model '{name}': {error}") from error

    _check_size(f"timm:{name}", build, config)
    return build()


# Small sizes for hf: models: each key is set where the family's config has it (its default
# is often billions of parameters). Width 64 with 4 heads of 16; two layers (of each stack).
HF_SMALL = {
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "hidden_size": 64,
    "n_embd": 64,
    "d_model": 64,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "d_kv": 16,
    "intermediate_size": 128,
    "n_inner": 128,
    "d_ff": 128,
    "ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
}
SHRINK_HINT = "--config num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128"


def _hf_model(name: str, config: Dict[str, Any]) -> nn.Module:
    transformers = _require("transformers", "hf:")
    try:
        default = transformers.AutoConfig.for_model(name).to_dict()
    except (ValueError, KeyError) as error:
        raise CliError(f"unknown HuggingFace model type '{name}' (use a model type such as gpt2, bert, t5)") from error
    unknown = [key for key in config if key not in default]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], list(default), n=3)
        raise CliError(
            f"hf:{name}'s config has no '{unknown[0]}'."
            + (f" Did you mean: {', '.join(close)}?" if close else f" Its keys: {', '.join(sorted(default))}")
        )
    small = {k: v for k, v in HF_SMALL.items() if k in default and k not in config}
    if "head_dim" in small:  # heads of the width each (or of the width given)
        width = next((config[k] for k in ("hidden_size", "n_embd", "d_model") if k in config), None)
        heads = next((config[k] for k in ("num_attention_heads", "n_head", "num_heads") if k in config), 4)
        small["head_dim"] = (width or HF_SMALL["hidden_size"]) // heads
    chosen = {**small, **config}
    try:
        built_config = transformers.AutoConfig.for_model(name, **chosen)
    except Exception as error:  # HF's own validation (a str where an int goes): its message, on one line
        said = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise CliError(f"--config: hf:{name}'s config refuses {_given(config)}: {said}") from error

    def build() -> nn.Module:
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
            try:
                return auto.from_config(built_config)
            except ValueError:
                continue
        raise CliError(f"no HuggingFace model class builds a '{name}' config")  # pragma: no cover

    _check_size(f"hf:{name}", build, chosen)
    if small:  # said once the size is accepted: a refused model is not called small
        print(
            f"torchlens: hf:{name} with small defaults where --config sets nothing ({_given(small)}); "
            "--config KEY=VALUE,... to change them"
        )
    return build()


def _given(config: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def _check_size(what: str, build: Any, config: Dict[str, Any]) -> None:
    """Build the model on the meta device (no memory), and refuse before building it for real
    when its parameters would not fit in the memory that is free (with room for the pass)."""
    free = available_memory()
    if free is None:
        return
    try:
        with torch.device("meta"):
            model = build()
    except CliError:
        raise
    except Exception:  # a model that cannot be built on meta: it is built for real, unchecked
        return
    num = sum(p.numel() for p in model.parameters())
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    if need > 0.75 * free:  # the random init and the traced pass need room too
        hint = SHRINK_HINT if what.startswith("hf:") else "--config with smaller sizes (e.g. depth=2)"
        raise CliError(
            f"{what}{' with this config' if config else ''} has about {num / 1e9:.1f} billion parameters "
            f"({need / 1e9:.1f} GB), and {free / 1e9:.1f} GB of memory is free: it would not fit. "
            f"Shrink it, e.g. {hint}"
        )


def parse_config(text: str) -> Dict[str, Any]:
    """``KEY=VALUE,...`` as a dict; each value becomes an int, a float, a bool or stays a string.

    Example:
        >>> parse_config("num_hidden_layers=2,hidden_act=gelu,dropout=0.1,use_cache=false")
        {'num_hidden_layers': 2, 'hidden_act': 'gelu', 'dropout': 0.1, 'use_cache': False}
    """
    out: Dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--config takes KEY=VALUE pairs separated by commas, not '{part}'")
        out[key.strip()] = _config_value(value.strip())
    return out


def _config_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _file_model(spec: str) -> nn.Module:
    """``FILE.py:NAME``: NAME is a module class (built with no arguments), a module instance, or
    a function returning a module."""
    path, _, name = spec.rpartition(":")
    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    module_spec = importlib.util.spec_from_file_location(f"torchlens_cli_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise ModelError(f"running {path} failed", error) from error
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        raise CliError(f"{path} has no attribute '{name}'")
    obj = getattr(module, name)
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise CliError(
            f"{path}:{name} is a {type(obj).__name__}, not a torch.nn.Module, a module class or a "
            "function returning a module"
        )
    try:
        model = obj()
    except TypeError as error:
        raise CliError(
            f"{path}:{name}() needs arguments ({error}); give the name of a module instance, or of a "
            "class or function that needs none"
        ) from error
    except Exception as error:
        raise ModelError(f"building {path}:{name}() failed", error) from error
    if not isinstance(model, nn.Module):
        raise CliError(f"{path}:{name}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def load_model(spec: str, config: Optional[Dict[str, Any]] = None) -> Tuple[nn.Module, str]:
    """A model and its kind ('vision', 'language', 'file') from ``source:name``; ``config``
    sets options of hf: configs (whose sizes are small by default) and timm: models.

    Example:
        >>> model, kind = load_model("torchvision:squeezenet1_1")
        >>> type(model).__name__, kind
        ('SqueezeNet', 'vision')
    """
    source, sep, name = spec.partition(":")
    if not sep or not name:
        raise CliError(f"model '{spec}' must look like torchvision:NAME, timm:NAME, hf:TYPE or FILE.py:CLASS")
    config = dict(config or {})
    if config and source not in ("hf", "timm"):
        raise CliError("--config is for hf: and timm: models (a file model is built by your code)")
    if source == "torchvision":
        return _torchvision_model(name), "vision"
    if source == "timm":
        return _timm_model(name, config), "vision"
    if source == "hf":
        return _hf_model(name, config), "language"
    if spec.rpartition(":")[0].endswith(".py"):
        return _file_model(spec), "file"
    raise CliError(f"unknown model source '{source}': use torchvision:, timm:, hf: or a .py file")


def parse_shape(text: str) -> Tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError as error:
        raise CliError(f"--input must be comma-separated integers like 1,3,224,224, not '{text}'") from error
    if not shape or any(n <= 0 for n in shape):
        raise CliError(f"--input sizes must be positive, got '{text}'")
    return shape


DTYPES = {
    "float": torch.float32,
    "float32": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "long": torch.int64,
    "int64": torch.int64,
    "int": torch.int32,
    "int32": torch.int32,
    "bool": torch.bool,
}


def make_inputs(
    model: nn.Module, kind: str, shape: Tuple[int, ...], dtype: Optional[str] = None, high: Optional[int] = None
) -> Tuple[List[Any], Dict[str, Any]]:
    """Random images, random token ids (``input_ids=``) for language models, or one random tensor
    of ``dtype``: floats in [0, 1), integers in [0, ``high``) (default: the smallest
    ``nn.Embedding`` of the model, else 2), bools.

    Example:
        >>> import torch
        >>> args, _ = make_inputs(torch.nn.Embedding(7, 2), "file", (2, 3), dtype="long")
        >>> args[0].dtype, int(args[0].max()) < 7
        (torch.int64, True)
    """
    if kind == "language":
        vocab = getattr(getattr(model, "config", None), "vocab_size", 1000) or 1000
        ids = torch.randint(0, high or vocab, shape)
        kwargs: Dict[str, Any] = {"input_ids": ids}
        if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
        return [], kwargs
    torch_dtype = DTYPES[dtype or "float"]
    if torch_dtype == torch.bool:
        return [torch.rand(shape) < 0.5], {}
    if torch_dtype.is_floating_point:
        return [torch.rand(shape, dtype=torch_dtype)], {}
    if high is None:
        sizes = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
        high = min(sizes) if sizes else 2
    return [torch.randint(0, high, shape, dtype=torch_dtype)], {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchlens",
        description="Trace every tensor operation of one forward pass of a model.",
        epilog=__doc__.split("Examples:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "model",
        help="torchvision:NAME, timm:NAME, hf:TYPE or path/to/file.py:NAME (a module "
        "class, a module instance, or a function returning a module)",
    )
    parser.add_argument(
        "--input",
        default=None,
        help="input shape, e.g. 1,3,224,224 (token ids shape for hf: models; default "
        "1,3,224,224 for images, 1,16 for language models)",
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="dtype of the random input of file models (default float; long for token ids)",
    )
    parser.add_argument(
        "--high",
        type=int,
        default=None,
        help="integer inputs are drawn from [0, HIGH) (default: the vocabulary size for hf: "
        "models; the smallest nn.Embedding of a file model, else 2)",
    )
    parser.add_argument(
        "-o", "--output", help="write the drawing here (.svg, .png or .pdf; .html: the interactive graph page)"
    )
    parser.add_argument("--rolled", action="store_true", help="draw one node per layer (passes folded)")
    parser.add_argument("--depth", type=int, default=None, help="collapse modules deeper than this")
    parser.add_argument("--validate", action="store_true", help="check the saved activations by replaying them")
    parser.add_argument("--seed", type=int, default=0, help="random seed for inputs and the pass (default 0)")
    parser.add_argument("--layer", action="append", default=[], help="also print this layer (repeatable)")
    parser.add_argument(
        "--config",
        metavar="KEY=VALUE,...",
        default=None,
        help="options of hf: configs (small by default: 2 layers, width 64; e.g. "
        "num_hidden_layers=4,hidden_size=128) and timm: models (e.g. num_classes=10); values are "
        "read as int, float, true/false or text. A model too big for the free memory is refused "
        "before it is built",
    )
    parser.add_argument("--traceback", action="store_true", help="on an error of the model, print the full traceback")
    return parser


EXPLORE_EPILOG = """\
examples:
  torchlens explore torchlens_runs/                    serve every run of the folder (a run picker)
  torchlens explore RUN_DIR --export run.html          one self-contained file: opens offline
  torchlens explore RUN_A RUN_B                        two runs side by side (pinned calls show both)
  torchlens explore torchlens_runs/ --export all.html  every run of the folder in one file
  torchlens explore torchlens_runs/ --export one.html --run NAME
                                                       only the run NAME (its folder, relative
                                                       to the served one, or its last part)
"""


def _pick_run(root: str, name: str) -> str:
    """The run id (a folder relative to ``root``) that ``name`` means: an id, or the last part of
    exactly one id."""
    from .train import Catalog

    catalog = Catalog(root)
    ids = catalog.run_ids()
    catalog.close()
    wanted = name.strip("/")
    if wanted in ids:
        return wanted
    matches = [i for i in ids if os.path.basename(i) == wanted]
    if len(matches) == 1:
        return matches[0]
    raise CliError(
        f"no run {name!r} under {root}"
        + (f" (it names several: {', '.join(matches)})" if matches else "")
        + (f"; the runs there: {', '.join(ids)}" if ids else "; there is no torchlens run there")
    )


def explore_main(argv: Sequence[str]) -> int:
    """``torchlens explore RUN_DIR [RUN_B] [--port N] [--host H] [--token T] [--export FILE [--run NAME]]``."""
    from .train import NotFound, PortInUseError, RunError, explore, export_html

    parser = argparse.ArgumentParser(
        prog="torchlens explore",
        description="Serve the explorer page of a run written by tl.watch, or of a folder of runs; "
        "or write it to one self-contained HTML file (--export).",
        epilog=EXPLORE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", help="a run folder (w.run_dir) or a folder holding runs")
    parser.add_argument(
        "other_run", nargs="?", help="a second run folder: serve both side by side (each pinned call shows both runs)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port to serve on (default 8080; 0: any free port)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1; any other wants a token)"
    )
    parser.add_argument(
        "--token", help="the token the URL carries when not on loopback (default: a random one, printed)"
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        help="write one self-contained HTML file instead of serving; for a folder of runs the file "
        "holds every run (with the run picker), or only --run NAME",
    )
    parser.add_argument(
        "--run",
        metavar="NAME",
        help="with --export: only this run of the folder (its folder relative to RUN_DIR, or its last part)",
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"torchlens: error: no such folder: {args.run_dir}", file=sys.stderr)
        return 2
    try:
        if args.other_run and args.export:
            raise CliError("--export writes one run (or folder); two runs side by side are served only")
        if args.other_run and not os.path.isdir(args.other_run):
            raise CliError(f"no such folder: {args.other_run}")
        if args.run and not args.export:
            raise CliError("--run NAME goes with --export; the served page has a run picker")
        if args.export:
            run_id = _pick_run(args.run_dir, args.run) if args.run else None
            export_html(args.run_dir, args.export, run_id=run_id)
            _print_exported(args.export, args.run_dir, run_id)
        else:
            explore(args.run_dir, port=args.port, host=args.host, token=args.token, other=args.other_run)
        return 0
    except PortInUseError:  # its message is for Python callers (port=); here it is --port
        print(
            f"torchlens: error: port {args.port} on {args.host} is in use (or not allowed): pass another "
            f"one, e.g. --port {args.port + 1} (or --port 0 for any free port)",
            file=sys.stderr,
        )
        return 2
    except (CliError, NotFound, RunError, FileNotFoundError, ValueError) as error:  # ValueError: a bad --token
        print(f"torchlens: error: {error}", file=sys.stderr)
        return 2


def _print_exported(path: str, root: str, run_id: Optional[str]) -> None:
    from .train import Catalog

    if run_id is None:
        catalog = Catalog(root)
        ids = catalog.run_ids()
        catalog.close()
        if len(ids) > 1:
            print(f"torchlens: wrote {path} ({len(ids)} runs: {', '.join(ids)}; --run NAME for one)")
            return
    print(f"torchlens: wrote {path}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    import torchlens as tl

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "explore":
        return explore_main(argv[1:])
    if argv and argv[0] == "runs":
        from .train import runs_main

        return runs_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        fileformat = _output_format(args.output)  # before the trace, which may take long
        torch.manual_seed(args.seed)
        model, kind = load_model(args.model, config=parse_config(args.config) if args.config else None)
        model.eval()
        if args.dtype and kind != "file":
            raise CliError(
                f"--dtype is for file models; {kind} models get "
                + ("token ids" if kind == "language" else "float images")
            )
        shape = parse_shape(args.input) if args.input else ((1, 16) if kind == "language" else (1, 3, 224, 224))
        input_args, input_kwargs = make_inputs(model, kind, shape, args.dtype, high=args.high)
        try:
            history = tl.log_forward_pass(model, input_args, input_kwargs, layers_to_save="all", random_seed=args.seed)
        except Exception as error:
            raise ModelError(f"tracing {args.model} with an input of shape {tuple(shape)} failed", error) from error
        print(history)
        for key in args.layer:
            print()
            print(history[key])
        if args.output:
            _draw(history, args, fileformat)
        if args.validate:
            ok = tl.validate_model_activations(model, input_args, input_kwargs, random_seed=args.seed, verbose=True)
            print(f"\nvalidate_model_activations: {'passed' if ok else 'FAILED'}")
            return 0 if ok else 1
        return 0
    except CliError as error:
        print(f"torchlens: error: {error}", file=sys.stderr)
        return 2
    except KeyError as error:
        print(f"torchlens: error: {error.args[0] if error.args else error}", file=sys.stderr)
        return 2
    except ModelError as error:
        _print_model_error(error, args.traceback)
        return 1


def _print_model_error(error: ModelError, full: bool) -> None:
    """The model's error as its type, message and notes (torchlens says which operation failed),
    without torchlens's and torch's frames unless --traceback."""
    cause = error.error
    print(f"torchlens: error: {error.what}:", file=sys.stderr)
    lines = (
        traceback.format_exception(type(cause), cause, cause.__traceback__)
        if full
        else traceback.format_exception_only(type(cause), cause)
    )
    print("".join(lines).rstrip(), file=sys.stderr)
    if not full:
        print("(add --traceback for the full traceback)", file=sys.stderr)


def _output_format(output: Optional[str]) -> Optional[str]:
    if not output:
        return None
    ext = os.path.splitext(output)[1]
    fileformat = ext.lstrip(".").lower() or "svg"
    if fileformat not in ("svg", "png", "pdf", "html"):
        raise CliError(f"-o must end in .svg, .png, .pdf or .html, not '{ext}'")
    return fileformat


def _draw(history: Any, args: argparse.Namespace, fileformat: str) -> None:
    from .trace.render import render_graph

    root = os.path.splitext(args.output)[0]
    if fileformat == "html":  # the interactive page: every module, rolled and unrolled, in one file
        history.to_html(args.output)
        print(f"\nInteractive graph written to {args.output}")
        return
    render_graph(
        history,
        vis_mode="rolled" if args.rolled else "unrolled",
        vis_nesting_depth=args.depth,
        vis_outpath=root,
        vis_fileformat=fileformat,
        vis_save_only=True,
    )
    print(f"\nDrawing written to {root}.{fileformat}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
