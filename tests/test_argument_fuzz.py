"""Bad arguments to every public function and method (issue 41): each one is refused where it
enters, by a ``TorchlensError`` that keeps its built-in base and names the argument; no call
hangs; after every call torch is unpatched and the model has no hook left.

Every (function, argument, value) below is a value the argument does not take; the counts at the
end make sure the fuzz ran (a table that silently shrank would not pass). Servers stay off: the
watches use ``backend=None`` and ports are checked before anything serves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import pathlib
import signal
import time
from typing import Any, Callable, Dict, List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.errors import TorchlensError
from torchlens.trace.capture import decorate

pytestmark = pytest.mark.slow

CALL_LIMIT_S = 60  # a call still running after this long has hung


class Odd:
    """An object no argument takes."""

    def __repr__(self) -> str:
        return "<odd object>"


ODD = Odd()
HUGE = 10**30
BOOL = [None, "yes", 2, 1.5, ODD]
OPT_BOOL = ["yes", 2, 1.5, ODD]
SEED = [True, 1.5, "3", -1, 2**64, ODD]
INT_POS = [None, True, 1.5, "3", 0, -1, HUGE, ODD]
OPT_INT_POS = [True, 1.5, "3", -1, HUGE, ODD]
FLOAT_NONNEG = [None, True, "0.1", -1.0, float("nan"), float("inf"), ODD]
OPT_FLOAT_NONNEG = [True, "0.1", -1.0, float("nan"), float("inf"), ODD]
CALLABLE = [None, 5, "relu", ODD, nn.Linear]
OPT_CALLABLE = [5, "relu", ODD, nn.Linear]
CHOICE = [5, "", "nonsense", ODD, True, torch.zeros(2)]
NOT_A_MODEL = [None, 5, "model", nn.Linear, ODD, F.relu]
NOT_A_HISTORY = [None, 5, "history", ODD, nn.Linear(3, 3)]
KWARGS = [5, "x", [1], ODD]
STR_NAME = [None, 5, "", ODD]


def write_paths(tmp: pathlib.Path) -> List[Any]:
    existing_file = tmp / "a-file"
    existing_file.write_text("x")
    return [None, 5, "", "a\0b", b"bytes", ODD, str(existing_file / "below")]


def read_paths(tmp: pathlib.Path) -> List[Any]:
    return [None, 5, "", "a\0b", b"bytes", ODD, str(tmp / "missing"), str(tmp / "missing-too" / "x")]


@dataclasses.dataclass
class Case:
    where: str
    call: Callable[..., Any]
    base: Dict[str, Any]
    argument: str
    values: List[Any]


class Model(nn.Module):
    """A numbered stack of blocks, so that patch_sweep has modules to patch."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.blocks = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
        self.out = nn.Linear(3, 2)

    def forward(self, x):
        return self.out(self.blocks(torch.relu(self.fc(x))))


ORIGINALS = {
    "torch.relu": (torch, "relu", torch._C._VariableFunctions.relu),
    "torch.cat": (torch, "cat", torch._C._VariableFunctions.cat),
    "F.linear": (F, "linear", torch._C._nn.linear),
    "Tensor.__add__": (torch.Tensor, "__add__", torch.Tensor.__add__),  # as imported, before any pass
    "Tensor.relu": (torch.Tensor, "relu", torch.Tensor.relu),
}


def _torch_unpatched() -> List[str]:
    changed = [name for name, (owner, attr, original) in ORIGINALS.items() if getattr(owner, attr) is not original]
    if decorate.ACTIVE.tracer is not None:
        changed.append("an active tracer")
    return changed


def _hooks_left(model: nn.Module) -> List[str]:
    left = []
    for name, module in model.named_modules():
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(module, kind):
                left.append(f"{name or 'model'}.{kind}")
    for name, param in model.named_parameters():
        if param._backward_hooks:
            left.append(f"{name} tensor hooks")
    g = nn.modules.module
    for kind in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks"):
        if getattr(g, kind):
            left.append(kind)
    return left


class _Hung(BaseException):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    def stop(signum, frame):
        raise _Hung()

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _cases(tmp: pathlib.Path, model: nn.Module, x: torch.Tensor) -> List[Case]:
    history = tl.log_forward_pass(model, x, save_function_args=True)
    other = tl.log_forward_pass(model, x)
    history.save(str(tmp / "saved"))
    run_dir = str(tmp / "run")
    with tl.watch(model, run_dir=run_dir, backend=None, verbose=False):
        for _ in range(2):
            model(x).sum().backward()
    model.zero_grad()
    run = tl.open_run(run_dir)
    other_run = tl.open_run(run_dir)
    watched = Model()  # the base call of unwatch closes its watch
    tl.watch(watched, run_dir=str(tmp / "watched"), backend=None, verbose=False)
    wp, rp = write_paths(tmp), read_paths(tmp)
    counter = iter(range(10**6))

    def fresh(name: str) -> Callable[[], str]:  # a new path for each call that would write one
        stem, dot, suffix = name.partition(".")
        return lambda: str(tmp / f"{stem}-{next(counter)}{dot}{suffix}")

    lfp = {"model": model, "input_args": x}
    cases = [Case("log_forward_pass", tl.log_forward_pass, lfp, "model", NOT_A_MODEL)]
    lfp_args = {
        "input_kwargs": KWARGS,
        "layers_to_save": [5.5, ODD, [1.5], "", True, {"fc": 1}],
        "keep_unsaved_layers": OPT_BOOL,
        "output_device": [5, True, "", "nonsense", ODD],
        "activation_postfunc": OPT_CALLABLE,
        "detach_saved_tensors": BOOL,
        "save_function_args": BOOL,
        "save_gradients": BOOL,
        "random_seed": SEED,
        "vis_mode": CHOICE,
        "vis_nesting_depth": [True, 1.5, "2", -1, ODD],
        "vis_outpath": [5, "", "a\0b", ODD],
        "vis_fileformat": [5, "", "nonsense", ODD],
        "vis_save_only": OPT_BOOL,
        "vis_direction": CHOICE,
        "intervene": [5, "x", [1], ODD, {"fc": 5}, {5.5: F.relu}],
        "save_to": wp[1:],
        "device": [5, True, "", "nonsense", ODD],
        "decompose": [5, "nonsense", ODD, ("nonsense",), True],
    }
    cases += [Case("log_forward_pass", tl.log_forward_pass, lfp, a, v) for a, v in lfp_args.items()]
    for name, fn in (
        ("get_model_metadata", tl.get_model_metadata),
        ("validate_model_activations", tl.validate_model_activations),
    ):
        cases += [
            Case(name, fn, lfp, "model", NOT_A_MODEL),
            Case(name, fn, lfp, "input_kwargs", KWARGS),
            Case(name, fn, lfp, "random_seed", SEED),
        ]
    cases.append(Case("validate_model_activations", tl.validate_model_activations, lfp, "verbose", BOOL))
    vh = {"history": history}
    cases += [
        Case("validate_history", tl.validate_history, vh, "history", NOT_A_HISTORY),
        Case("validate_history", tl.validate_history, vh, "expected_outputs", [5, "x", ODD, [5], torch.zeros(2)]),
        Case("validate_history", tl.validate_history, vh, "verbose", BOOL),
    ]
    rg = {"history": history, "vis_outpath": fresh("graph"), "vis_save_only": True, "vis_fileformat": "svg"}
    render_args = {
        "history": NOT_A_HISTORY,
        "vis_mode": CHOICE,
        "vis_nesting_depth": [True, 1.5, "2", -1, ODD],
        "vis_direction": CHOICE,
        "vis_outpath": [5, "", "a\0b", ODD],
        "vis_fileformat": [5, "", "nonsense", ODD],
        "vis_save_only": OPT_BOOL,
        "graph_attrs": [5, "x", ODD, {"rankdir": ODD}],
        "node_attrs": [5, "x", ODD],
        "edge_attrs": [5, "x", ODD],
        "module_attrs": [5, "x", ODD],
        "extra_edges": [5, ODD, [("nolayer", "alsonot")], [5]],
        "progress": OPT_BOOL,
        "inline_single_op_modules": BOOL,
        "show_gradients": OPT_BOOL,
    }
    cases += [Case("render_graph", tl.render_graph, rg, a, v) for a, v in render_args.items()]
    smg = {**lfp, "vis_outpath": fresh("graph"), "vis_save_only": True, "vis_fileformat": "svg"}
    cases += [
        Case("show_model_graph", tl.show_model_graph, smg, a, v)
        for a, v in {
            "model": NOT_A_MODEL,
            "input_kwargs": KWARGS,
            "vis_mode": CHOICE,
            "vis_nesting_depth": [True, 1.5, -1, ODD],
            "vis_direction": CHOICE,
            "vis_outpath": [5, "", ODD],
            "vis_fileformat": [5, "", "nonsense", ODD],
            "vis_save_only": OPT_BOOL,
            "random_seed": SEED,
        }.items()
    ]
    fn_args = {
        "model": NOT_A_MODEL,
        "input_kwargs": KWARGS,
        "backward": BOOL,
        "loss_fn": OPT_CALLABLE,
        "random_seed": SEED,
    }
    cases += [Case("find_nonfinite", tl.find_nonfinite, lfp, a, v) for a, v in fn_args.items()]
    cmp = {"a": history, "b": other}
    cases += [
        Case("compare", tl.compare, cmp, "a", [None, 5, "x", ODD]),
        Case("compare", tl.compare, cmp, "b", [None, 5, "x", ODD]),
        Case("compare", tl.compare, cmp, "rtol", FLOAT_NONNEG),
        Case("compare", tl.compare, cmp, "atol", FLOAT_NONNEG),
        Case("compare", tl.compare, cmp, "random_seed", SEED),
    ]
    cp_args = {
        "model": NOT_A_MODEL,
        "input_kwargs": KWARGS,
        "dtype": [None, 5, "bfloat16x", ODD, torch.int64],
        "rtol": OPT_FLOAT_NONNEG,
        "atol": OPT_FLOAT_NONNEG,
        "random_seed": SEED,
    }
    cases += [Case("compare_precision", tl.compare_precision, lfp, a, v) for a, v in cp_args.items()]
    mr_args = {
        "model": NOT_A_MODEL,
        "input_kwargs": KWARGS,
        "optimizer": [5, "adamw2", ODD, nn.Linear],
        "device": [5, True, "", "nonsense", ODD],
        "training": BOOL,
    }
    cases += [Case("memory_report", tl.memory_report, lfp, a, v) for a, v in mr_args.items()]
    pa = {**lfp, "source": other, "at": "fc", "metric": lambda out: out.sum()}
    patch_args = {
        "model": NOT_A_MODEL,
        "source": NOT_A_HISTORY,
        "at": [None, HUGE, ODD, "nolayer", [5.5]],
        "metric": OPT_CALLABLE,
        "position_dim": [None, True, 1.5, "1", ODD],
        "n_heads": OPT_INT_POS,
        "input_kwargs": KWARGS,
        "random_seed": SEED,
        "replay": BOOL,
    }
    cases += [Case("patch", tl.patch, pa, a, v) for a, v in patch_args.items()]
    ps = {**lfp, "source": other, "metric": lambda out: out.sum()}
    sweep_args = {
        "model": NOT_A_MODEL,
        "source": NOT_A_HISTORY,
        "metric": CALLABLE,
        "over": [None, 5, "", "nonsense", ODD],
        "position_dim": [None, True, 1.5, "1", ODD],
        "n_heads": OPT_INT_POS,
        "input_kwargs": KWARGS,
        "random_seed": SEED,
        "replay": BOOL,
        "verify": BOOL,
    }
    cases += [Case("patch_sweep", tl.patch_sweep, ps, a, v) for a, v in sweep_args.items()]
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=1, n_embd=8, n_head=2, vocab_size=20, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    lm = transformers.GPT2LMHeadModel(config).eval()
    lg = {"model": lm, "input_ids": torch.tensor([[1, 2]]), "max_new_tokens": 2}
    generate_args = {
        "model": NOT_A_MODEL + [model],
        "input_ids": [None, 5, "x", ODD, torch.rand(1, 2)],
        "max_new_tokens": [True, 1.5, "2", 0, -1, HUGE, ODD],
        "layers_to_save": [5.5, ODD, [1.5], "", True],
        "keep_unsaved_layers": OPT_BOOL,
        "output_device": [5, True, "", "nonsense", ODD],
        "activation_postfunc": OPT_CALLABLE,
        "detach_saved_tensors": BOOL,
        "random_seed": SEED,
        "save_to": wp[1:],
        "reuse_structure": BOOL,
        "decompose": [5, "nonsense", ODD, ("nonsense",), True],
    }
    cases += [Case("log_generate", tl.log_generate, lg, a, v) for a, v in generate_args.items()]
    wa = {"model": model, "run_dir": fresh("watch"), "backend": None, "verbose": False}
    watch_args = {
        "model": NOT_A_MODEL,
        "log_freq": INT_POS,
        "log": [None, 5, "", "io2", ODD, [], ["io", 5], {"io": 1}],
        "backend": [5, "", "nonsense", ODD, ["standalone", 5], True],
        "run_dir": [5, "", "a\0b", b"bytes", ODD, wp[-1]],
        "port": [None, True, False, 1.5, "8080", -1, 65536, HUGE, ODD],
        "sample_n": [True, 1.5, "100", 0, -1, HUGE, ODD],
        "reject_outlier_proportion": [None, True, "0.1", -0.1, 1.0, float("nan"), ODD],
        "disable_inplace": BOOL,
        "ignore_io_grad_classes": [5, ODD, [5], "x"],
        "delay_log_multibackward": BOOL,
        "host": [None, 5, "", ODD],
        "max_columns": [None, True, 1.5, 1, HUGE, ODD],
        "verbose": BOOL,
        "wandb_html_every": [None, True, 1.5, 0, -1, ODD],
        "manual_steps": BOOL,
        "input_grads": BOOL,
        "on_nonfinite": CHOICE,
        "optimizer": [5, "adam", ODD, [5]],
        "durable": BOOL,
    }
    cases += [Case("watch", tl.watch, wa, a, v) for a, v in watch_args.items()]
    cases += [
        Case("unwatch", tl.unwatch, {"model": watched}, "model", NOT_A_MODEL + [Model()]),
        Case("attach", tl.attach, {"tensor": x, "module": model, "name": "t"}, "tensor", [None, 5, ODD]),
        Case("attach", tl.attach, {"tensor": x, "module": model, "name": "t"}, "module", NOT_A_MODEL),
        Case("attach", tl.attach, {"tensor": x, "module": model, "name": "t"}, "name", STR_NAME),
        Case("setup", tl.setup, {"verbose": False}, "limit", [None, True, 1.5, "100", 0, -1, HUGE, ODD]),
        Case("setup", tl.setup, {"verbose": False}, "verbose", BOOL),
        Case("open_run", tl.open_run, {"run_dir": run_dir}, "run_dir", rp),
        Case("Run", tl.Run, {"run_dir": run_dir}, "run_dir", rp),  # the one class users construct
        Case("load", tl.load, {"path": str(tmp / "saved")}, "path", rp),
    ]
    h = history
    cases += [
        Case("ModelHistory.save", h.save, {"path": fresh("saved")}, "path", wp),
        Case("ModelHistory.save", h.save, {"path": fresh("saved")}, "overwrite", BOOL),
        Case("ModelHistory.to_html", h.to_html, {"path": fresh("page.html")}, "path", wp[1:]),
        Case("ModelHistory.to_html", h.to_html, {}, "overlay", [5, "x", ODD, {"nolayer": 1.0}]),
        Case("ModelHistory.to_html", h.to_html, {}, "focus", [5, "", "nolayer", ODD]),
        Case("ModelHistory.export", h.export, {"path": fresh("model.parquet")}, "path", wp),
        Case("ModelHistory.export", h.export, {"path": fresh("model.parquet")}, "format", [5, "", "nonsense", ODD]),
        Case("ModelHistory.export", h.export, {"path": fresh("model.parquet")}, "overwrite", BOOL),
        Case("ModelHistory.export", h.export, {"path": fresh("model.parquet")}, "weights", [5, "x", ODD]),
        Case("ModelHistory.show", h.show, {}, "height", [None, True, 1.5, "640", -1, 99, HUGE, ODD]),
        Case(
            "ModelHistory.rerun",
            h.rerun,
            {"changes": {"linear_1_1": torch.zeros(2, 3)}},
            "changes",
            [None, 5, "x", ODD, {"nolayer": 1}, {"fc": "x"}],
        ),
        Case("Run.steps_after", run.steps_after, {"step": 0}, "step", [None, True, 1.5, "1", ODD]),
        Case("Run.series_names", run.series_names, {}, "call_id", [5, ODD, b"fc:1"]),
        Case(
            "Run.series",
            run.series,
            {"call_id": "fc:1", "kind": "params", "name": "weight"},
            "call_id",
            [None, 5, ODD, "nocall"],
        ),
        Case(
            "Run.series",
            run.series,
            {"call_id": "fc:1", "kind": "params", "name": "weight"},
            "kind",
            [None, 5, ODD, "nokind"],
        ),
        Case(
            "Run.series",
            run.series,
            {"call_id": "fc:1", "kind": "params", "name": "weight"},
            "name",
            [None, 5, ODD, "noname"],
        ),
        Case(
            "Run.series",
            run.series,
            {"call_id": "fc:1", "kind": "params", "name": "weight"},
            "since",
            [True, 1.5, "1", ODD],
        ),
        Case("Run.export", run.export, {"path": fresh("run.parquet")}, "path", wp),
        Case("Run.export", run.export, {"path": fresh("run.parquet")}, "format", [5, "", "nonsense", ODD]),
        Case("Run.export", run.export, {"path": fresh("run.parquet")}, "overwrite", BOOL),
        Case("Run.compare", run.compare, {"other": other_run}, "other", [None, 5, "run", ODD, history]),
        Case(
            "Run.compare",
            run.compare,
            {"other": other_run},
            "tolerance",
            [None, True, "0.1", -0.1, 1.0, float("nan"), ODD],
        ),
    ]
    return cases


def _named(error: BaseException, argument: str) -> bool:
    text = str(error) + "\n".join(getattr(error, "__notes__", []))
    return argument in text


def _kwargs(case: Case, value: Any = None, with_value: bool = True) -> Dict[str, Any]:
    """The case's arguments, a fresh path where one is written, and the bad value."""
    kwargs = {k: (v() if callable(v) and k in ("path", "run_dir", "vis_outpath") else v) for k, v in case.base.items()}
    if with_value:
        kwargs[case.argument] = value
    return kwargs


def _close(outcome: Any) -> None:
    if isinstance(outcome, (tl.Watch, tl.Run)):
        outcome.close()


def test_every_bad_argument_is_refused_clearly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a value wrongly taken as a relative path writes here, not in the checkout
    torch.manual_seed(0)
    model = Model()
    x = torch.rand(2, 3)
    cases = _cases(tmp_path, model, x)
    # each function with its base arguments works: a refusal below is the bad argument's doing
    bases = {}
    for case in cases:
        bases.setdefault((case.where, id(case.base)), case)
    failed = []
    for (where, _), case in bases.items():
        with _time_limit(CALL_LIMIT_S), contextlib.redirect_stdout(None):
            try:
                _close(case.call(**_kwargs(case, with_value=False)))
            except Exception as error:  # show() outside a notebook says so: its argument was taken
                if not (where == "ModelHistory.show" and "notebook" in str(error)):
                    failed.append(f"{where}: {type(error).__name__}: {error}")
    assert not failed, "\n".join(failed)
    assert not _hooks_left(model) and not _torch_unpatched()
    calls, refused, problems = 0, 0, []
    slowest = 0.0
    for case in cases:
        for value in case.values:
            kwargs = _kwargs(case, value)
            calls += 1
            start = time.perf_counter()
            outcome: Any = None
            try:
                with _time_limit(CALL_LIMIT_S), contextlib.redirect_stdout(None):
                    outcome = case.call(**kwargs)
            except _Hung:
                problems.append(f"{case.where}({case.argument}={value!r}): still running after {CALL_LIMIT_S} s")
            except TorchlensError as error:
                refused += 1
                if not isinstance(error, (TypeError, ValueError, LookupError, OSError)):
                    problems.append(
                        f"{case.where}({case.argument}={value!r}): {type(error).__name__} has no built-in base"
                    )
                if not _named(error, case.argument):
                    problems.append(
                        f"{case.where}({case.argument}={value!r}): {type(error).__name__} without the argument's name: {error}"
                    )
            except BaseException as error:  # noqa: BLE001 - what the fuzz looks for
                problems.append(
                    f"{case.where}({case.argument}={value!r}): bare {type(error).__name__}: {str(error)[:200]}"
                )
            else:
                problems.append(f"{case.where}({case.argument}={value!r}): accepted")
                _close(outcome)
            slowest = max(slowest, time.perf_counter() - start)
            changed = _torch_unpatched()
            if changed:
                problems.append(f"{case.where}({case.argument}={value!r}): torch left patched: {changed}")
            hooks = _hooks_left(model)
            if hooks:
                problems.append(f"{case.where}({case.argument}={value!r}): hooks left: {hooks}")
                with contextlib.suppress(Exception):
                    tl.unwatch(model)
    functions = {c.where for c in cases}
    print(
        f"\n{len(functions)} functions, {len(cases)} arguments, {calls} calls, {refused} refused; slowest {slowest:.2f} s"
    )
    assert not problems, f"{len(problems)} of {calls} calls:\n" + "\n".join(problems)
    assert len(functions) == 30 and len(cases) == 157
    # every public function, and every method of a history or run that takes an argument, is fuzzed
    public = {n for n in tl.__all__ if inspect.isfunction(getattr(tl, n))}
    public |= {"Run"} | {f"ModelHistory.{n}" for n in ("save", "to_html", "export", "show", "rerun")}
    public |= {
        f"Run.{n}"
        for n, v in vars(tl.Run).items()
        if inspect.isfunction(v) and not n.startswith("_") and len(inspect.signature(v).parameters) > 1
    }
    assert public == functions, public ^ functions
    assert calls == refused == 817
