"""torchlens: see every tensor operation inside a PyTorch model.

Example:
    >>> import torch, torchlens as tl
    >>> history = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.rand(1, 3))
    >>> history.layer_labels
    ['input_1_0', 'linear_1_1', 'output_1_2']
"""

from .api import get_model_metadata, log_forward_pass, validate_model_activations
from .history.model_history import ModelHistory
from .records.func_call import FuncCallLocation
from .records.tensor_log import TensorLogEntry
from .render import GraphvizNotFoundError, render_graph
from .rerun import RerunError
from .show import show_model_graph
from .storage import HistoryFileError, UnsavedValuesWarning, load
from .validate import validate_history
from .version import __version__
from .watch import Run, RunError, Series, Watch, attach, open_run, setup, unwatch, watch

__all__ = [
    "log_forward_pass",
    "load",
    "HistoryFileError",
    "UnsavedValuesWarning",
    "get_model_metadata",
    "validate_model_activations",
    "validate_history",
    "show_model_graph",
    "render_graph",
    "RerunError",
    "GraphvizNotFoundError",
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
    "__version__",
]
