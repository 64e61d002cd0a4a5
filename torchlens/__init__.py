"""torchlens: see every tensor operation inside a PyTorch model, and watch a model train.

Two wings over one front end. What flows where::

    model, inputs
      |  trace/capture      the decorator layer on torch functions and Tensor methods, installed
      |                     for one pass; one flat record per operation (trace/records)
      v
    PassResult (plain records) --> trace/postprocess  prune, recurrent passes, labels
                                        |
                                        v
                                  trace/history        ModelHistory: the records, its lookup
                                        |              index, the rolled view
          +--------------+--------------+--------------+---------------+
          v              v              v              v               v
    trace/render    trace/replay    trace/storage   trace/rerun,    train/ (tl.watch): the
    graphviz and    (one saved op   save, load,     intervene       module-call graph, from a
    the graph page  again) ->       save_to                         traced pass it subscribes
    data            validate                                        to (trace/observe), then
                                                                    hooks -> histograms -> the
                                                                    run database -> reader ->
                                                                    page server, wandb, TensorBoard
          |                                                                |
          +-------------------------> web/ <-------------------------------+
                          the pages' assets, inlining, and the one
                          statistics/histogram rule both pages use

``trace/api.py`` (log_forward_pass, get_model_metadata, validate_model_activations) drives the
trace wing; the two wings meet only at ``ModelHistory`` and the pass observer; ``web`` and
``errors`` (``TorchlensError``, the base of every torchlens exception) are below both.

Example:
    >>> import torch, torchlens as tl
    >>> history = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.rand(1, 3))
    >>> history.layer_labels
    ['input_1_0', 'linear_1_1', 'output_1_2']
"""

import importlib
from typing import TYPE_CHECKING, Any, List

from .errors import TorchlensError
from .trace.api import get_model_metadata, log_forward_pass, validate_model_activations
from .trace.capture import ActivationMemoryWarning
from .trace.draw_options import DrawOptions
from .trace.history.model_history import ModelHistory
from .trace.records.func_call import FuncCallLocation
from .trace.records.meta import MetaDeviceError
from .trace.records.tensor_log import TensorLogEntry
from .version import __version__

# Public names whose layers load on first use: drawing, rerunning and the training explorer
# are not needed to trace, and importing them would double the time of ``import torchlens``.
_LAZY = {
    "render_graph": "torchlens.trace.render",
    "GraphvizNotFoundError": "torchlens.trace.render",
    "show_model_graph": "torchlens.trace.show",
    "RerunError": "torchlens.trace.rerun",
    "DecomposeError": "torchlens.trace.capture",
    "AttentionNotFoundError": "torchlens.trace.history.attention",
    "validate_history": "torchlens.trace.validate",
    **{name: "torchlens.trace.storage" for name in ("load", "HistoryFileError", "UnsavedValuesWarning")},
    **{name: "torchlens.trace.answers" for name in ("find_nonfinite", "NonfiniteReport")},
    **{name: "torchlens.trace.answers" for name in ("compare", "compare_precision", "Comparison", "CompareError")},
    **{name: "torchlens.trace.answers" for name in ("memory_report", "MemoryReport")},
    **{name: "torchlens.trace.patching" for name in ("patch", "patch_sweep", "PatchResult", "PatchGrid", "PatchError")},
    **{name: "torchlens.trace.generate" for name in ("log_generate", "GenerateHistory")},
    **{name: "torchlens.train" for name in ("watch", "unwatch", "attach", "setup", "open_run")},
    **{name: "torchlens.train" for name in ("Run", "RunError", "Series", "Watch")},
    **{name: "torchlens.train" for name in ("NonfiniteError", "NonfiniteWarning", "DivergenceWarning")},
    "RankMismatchError": "torchlens.train",
}

if TYPE_CHECKING:
    from .trace.answers import (
        CompareError,
        Comparison,
        MemoryReport,
        NonfiniteReport,
        compare,
        compare_precision,
        find_nonfinite,
        memory_report,
    )
    from .trace.capture import DecomposeError
    from .trace.generate import GenerateHistory, log_generate
    from .trace.history.attention import AttentionNotFoundError
    from .trace.patching import PatchError, PatchGrid, PatchResult, patch, patch_sweep
    from .trace.render import GraphvizNotFoundError, render_graph
    from .trace.rerun import RerunError
    from .trace.show import show_model_graph
    from .trace.storage import HistoryFileError, UnsavedValuesWarning, load
    from .trace.validate import validate_history
    from .train import (
        DivergenceWarning,
        NonfiniteError,
        NonfiniteWarning,
        RankMismatchError,
        Run,
        RunError,
        Series,
        Watch,
        attach,
        open_run,
        setup,
        unwatch,
        watch,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchlens' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "log_forward_pass",
    "DrawOptions",
    "load",
    "HistoryFileError",
    "UnsavedValuesWarning",
    "ActivationMemoryWarning",
    "MetaDeviceError",
    "get_model_metadata",
    "validate_model_activations",
    "validate_history",
    "show_model_graph",
    "render_graph",
    "RerunError",
    "DecomposeError",
    "AttentionNotFoundError",
    "GraphvizNotFoundError",
    "find_nonfinite",
    "NonfiniteReport",
    "compare",
    "compare_precision",
    "Comparison",
    "CompareError",
    "memory_report",
    "MemoryReport",
    "patch",
    "patch_sweep",
    "PatchResult",
    "PatchGrid",
    "PatchError",
    "log_generate",
    "GenerateHistory",
    "ModelHistory",
    "TensorLogEntry",
    "FuncCallLocation",
    "watch",
    "unwatch",
    "attach",
    "setup",
    "open_run",
    "Run",
    "RunError",
    "Series",
    "Watch",
    "NonfiniteError",
    "NonfiniteWarning",
    "DivergenceWarning",
    "RankMismatchError",
    "TorchlensError",
    "__version__",
]
