"""What a ``ModelHistory`` can do with the help of higher layers: draw itself, write its graph
page, save itself, rerun. Those layers import ``history``, so ``history`` must not import them:
each registers its function here when it is imported, and the history's methods look it up by
name (importing the providing layer on first use, so ``import torchlens`` need not load them).

Example:
    >>> import torchlens
    >>> from torchlens.trace.history.extensions import extension
    >>> extension("save").__name__
    'save_history'
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

_PROVIDERS = {
    "svg": "torchlens.trace.render",
    "to_html": "torchlens.trace.render",
    "show": "torchlens.trace.render",
    "notebook_html": "torchlens.trace.render",
    "mimebundle": "torchlens.trace.render",
    "save": "torchlens.trace.storage",
    "rerun": "torchlens.trace.rerun",
    "first_nonfinite": "torchlens.trace.answers",
    "export": "torchlens.trace.export",
}
_REGISTERED: Dict[str, Callable[..., Any]] = {}


def provide(name: str, function: Callable[..., Any]) -> None:
    """Register ``function`` as the implementation of the history feature ``name``."""
    if name not in _PROVIDERS:
        raise ValueError(f"unknown ModelHistory extension {name!r}; known: {', '.join(_PROVIDERS)}")
    _REGISTERED[name] = function


def extension(name: str) -> Callable[..., Any]:
    """The function registered for ``name``, importing the layer that provides it if needed."""
    function = _REGISTERED.get(name)
    if function is None:
        importlib.import_module(_PROVIDERS[name])  # registers it
        function = _REGISTERED.get(name)
    if function is None:
        raise RuntimeError(
            f"ModelHistory needs {_PROVIDERS[name]} for this; import torchlens (or {_PROVIDERS[name]}) first."
        )
    return function
