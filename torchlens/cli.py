"""``python -m torchlens`` / ``torchlens``: trace a model from the shell.

Examples:
    torchlens torchvision:resnet18 --input 1,3,224,224 -o resnet.svg --depth 2
    torchlens hf:gpt2 --input 1,16 --validate
    torchlens timm:convmixer_768_32 --input 1,3,64,64
    torchlens path/to/model.py:MyNet --input 2,10 --rolled -o net.pdf
    torchlens explore torchlens_runs/ --port 8080      # the explorer page of watched runs
    torchlens explore RUN_DIR --export page.html       # one self-contained file
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn


class CliError(Exception):
    """A problem with what was asked on the command line (printed without a traceback)."""


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
        raise CliError(f"unknown torchvision model '{name}'." + (f" Did you mean: {', '.join(close)}?" if close else ""))
    return torchvision.models.get_model(name, weights=None)


def _timm_model(name: str) -> nn.Module:
    timm = _require("timm", "timm:")
    try:
        return timm.create_model(name, pretrained=False)
    except RuntimeError as error:
        raise CliError(f"unknown timm model '{name}': {error}") from error


def _hf_model(name: str) -> nn.Module:
    transformers = _require("transformers", "hf:")
    try:
        config = transformers.AutoConfig.for_model(name)
    except (ValueError, KeyError) as error:
        raise CliError(f"unknown HuggingFace model type '{name}' (use a model type such as gpt2, bert, t5)") from error
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        try:
            return auto.from_config(config)
        except ValueError:
            continue
    raise CliError(f"no HuggingFace model class builds a '{name}' config")  # pragma: no cover


def _file_model(spec: str) -> nn.Module:
    path, _, class_name = spec.rpartition(":")
    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    module_spec = importlib.util.spec_from_file_location(f"torchlens_cli_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise CliError(f"{path} has no attribute '{class_name}'")
    model = cls()
    if not isinstance(model, nn.Module):
        raise CliError(f"{path}:{class_name} is not a torch.nn.Module")
    return model


def load_model(spec: str) -> Tuple[nn.Module, str]:
    """A model and its kind ('vision', 'language', 'file') from ``source:name``."""
    source, sep, name = spec.partition(":")
    if not sep or not name:
        raise CliError(f"model '{spec}' must look like torchvision:NAME, timm:NAME, hf:TYPE or FILE.py:CLASS")
    if source == "torchvision":
        return _torchvision_model(name), "vision"
    if source == "timm":
        return _timm_model(name), "vision"
    if source == "hf":
        return _hf_model(name), "language"
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


def make_inputs(model: nn.Module, kind: str, shape: Tuple[int, ...]) -> Tuple[List[Any], Dict[str, Any]]:
    """Random images, or random token ids (``input_ids=``) for language models."""
    if kind == "language":
        vocab = getattr(getattr(model, "config", None), "vocab_size", 1000) or 1000
        ids = torch.randint(0, vocab, shape)
        kwargs: Dict[str, Any] = {"input_ids": ids}
        if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
        return [], kwargs
    return [torch.rand(shape)], {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchlens",
        description="Trace every tensor operation of one forward pass of a model.",
        epilog=__doc__.split("Examples:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="torchvision:NAME, timm:NAME, hf:TYPE or path/to/file.py:CLASS")
    parser.add_argument("--input", default=None,
                        help="input shape, e.g. 1,3,224,224 (token ids shape for hf: models; default "
                             "1,3,224,224 for images, 1,16 for language models)")
    parser.add_argument("-o", "--output", help="write the drawing here (.svg, .png or .pdf)")
    parser.add_argument("--rolled", action="store_true", help="draw one node per layer (passes folded)")
    parser.add_argument("--depth", type=int, default=None, help="collapse modules deeper than this")
    parser.add_argument("--validate", action="store_true", help="check the saved activations by replaying them")
    parser.add_argument("--seed", type=int, default=0, help="random seed for inputs and the pass (default 0)")
    parser.add_argument("--layer", action="append", default=[], help="also print this layer (repeatable)")
    return parser


def explore_main(argv: Sequence[str]) -> int:
    """``torchlens explore RUN_DIR [--port N] [--host H] [--export FILE]``."""
    from .explorer import PortInUseError, explore, export_html
    from .watch.reader import RunError

    parser = argparse.ArgumentParser(prog="torchlens explore",
                                     description="Serve the explorer page of a run written by tl.watch, "
                                                 "or of a folder of runs.")
    parser.add_argument("run_dir", help="a run folder (w.run_dir) or a folder holding runs")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--export", metavar="FILE", help="write one self-contained HTML file instead of serving")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"torchlens: error: no such folder: {args.run_dir}", file=sys.stderr)
        return 2
    try:
        if args.export:
            export_html(args.run_dir, args.export)
            print(f"torchlens: wrote {args.export}")
        else:
            explore(args.run_dir, port=args.port, host=args.host)
        return 0
    except (PortInUseError, RunError, FileNotFoundError) as error:
        print(f"torchlens: error: {error}", file=sys.stderr)
        return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    import torchlens as tl

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "explore":
        return explore_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        torch.manual_seed(args.seed)
        model, kind = load_model(args.model)
        model.eval()
        shape = parse_shape(args.input) if args.input else ((1, 16) if kind == "language" else (1, 3, 224, 224))
        input_args, input_kwargs = make_inputs(model, kind, shape)
        history = tl.log_forward_pass(model, input_args, input_kwargs, layers_to_save="all", random_seed=args.seed)
        print(history)
        for key in args.layer:
            print()
            print(history[key])
        if args.output:
            _draw(history, args)
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


def _draw(history: Any, args: argparse.Namespace) -> None:
    from .render import render_graph

    root, ext = os.path.splitext(args.output)
    fileformat = ext.lstrip(".").lower() or "svg"
    if fileformat not in ("svg", "png", "pdf"):
        raise CliError(f"-o must end in .svg, .png or .pdf, not '{ext}'")
    render_graph(history, vis_mode="rolled" if args.rolled else "unrolled", vis_nesting_depth=args.depth,
                 vis_outpath=root, vis_fileformat=fileformat, vis_save_only=True)
    print(f"\nDrawing written to {root}.{fileformat}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
