"""``PatchGrid``: the metric of every cell of a patching sweep, with labelled axes.

Example:
    >>> import numpy as np
    >>> g = PatchGrid(np.array([[1.0, 2.0]]), ("layer", "position"), {"layer": ["h.0"], "position": [0, 1]},
    ...               labels=["add_1_1"], corrupt=1.0, clean=3.0)
    >>> g.recovered().tolist(), g.sel(layer="h.0", position=1)
    ([[0.0, 0.5]], 2.0)
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .select import PatchError


@dataclass
class PatchGrid:
    """``values[i, j]`` (or ``[i, h, j]`` with heads): the metric with layer ``coords['layer'][i]``
    patched at position ``coords['position'][j]`` (and head ``h``). ``labels``: each layer's
    label in the run patched (the op painted on the graph page). ``corrupt`` / ``clean``: the
    metric of the run unpatched and of the source run (None when the source's output does not
    line up). ``seconds``: time of the sweep's cells; ``modes``: how many cells were replayed
    from the graph and how many ran the model.

    Example:
        >>> import numpy as np
        >>> g = PatchGrid(np.zeros((2, 3)), ("layer", "position"), {"layer": ["a", "b"], "position": [0, 1, 2]},
        ...               labels=["x_1_1", "y_1_2"], corrupt=0.0, clean=1.0)
        >>> g.to_pandas().shape, g.overlay()["scale"]
        ((2, 3), 'diverging')
    """

    values: np.ndarray
    dims: Tuple[str, ...]
    coords: Dict[str, List[Any]]
    labels: List[str]
    corrupt: float
    clean: Optional[float]
    history: Any = None
    seconds: float = 0.0
    modes: Dict[str, int] = field(default_factory=dict)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.values.shape)

    def effect(self) -> np.ndarray:
        """``values - corrupt``."""
        return self.values - self.corrupt

    def recovered(self) -> np.ndarray:
        """``(values - corrupt) / (clean - corrupt)``: 1 where a patch brings back the clean metric."""
        if self.clean is None or self.clean == self.corrupt:
            raise PatchError(
                "patch_sweep: no clean metric to normalise by (the source's output does not line up with this run's, "
                "or both metrics are equal); use effect() instead."
            )
        return (self.values - self.corrupt) / (self.clean - self.corrupt) + 0.0  # + 0.0: no -0.0 in tables

    def sel(self, **where: Any) -> Any:
        """The value(s) at the named coordinates, e.g. ``grid.sel(layer='transformer.h.3', position=5)``."""
        index: List[Any] = []
        for dim in self.dims:
            if dim in where:
                try:
                    index.append(self.coords[dim].index(where.pop(dim)))
                except ValueError:
                    raise PatchError(
                        f"patch_sweep: that {dim} is not in the grid; it has {self.coords[dim]}."
                    ) from None
            else:
                index.append(slice(None))
        if where:
            raise PatchError(f"patch_sweep: the grid has no axis {sorted(where)}; its axes are {self.dims}.")
        found = self.values[tuple(index)]
        return float(found) if np.ndim(found) == 0 else found

    def to_pandas(self, recovered: bool = False) -> Any:
        """A DataFrame: rows are layers (and heads), columns positions."""
        import pandas as pd

        values = self.recovered() if recovered else self.values
        columns = pd.Index(self.coords[self.dims[-1]], name=self.dims[-1])
        if len(self.dims) == 2:
            return pd.DataFrame(values, index=pd.Index(self.coords["layer"], name="layer"), columns=columns)
        rows = pd.MultiIndex.from_product([self.coords[d] for d in self.dims[:-1]], names=list(self.dims[:-1]))
        return pd.DataFrame(values.reshape(-1, values.shape[-1]), index=rows, columns=columns)

    def overlay(self) -> Dict[str, Any]:
        """For ``history.to_html(overlay=...)``: each patched op coloured by the strongest effect
        of patching it (over positions and heads), blue below the unpatched metric, red above."""
        effect = self.effect().reshape(len(self.labels), -1)
        strongest = effect[np.arange(len(self.labels)), np.abs(effect).argmax(axis=1)]
        return {
            "values": {label: float(v) for label, v in zip(self.labels, strongest)},
            "name": "patching effect",
            "scale": "diverging",
            "caption": f"metric patched - unpatched ({self.corrupt:.4g}), strongest over {', '.join(self.dims[1:])}",
        }

    def to_html(self, path: Optional[str] = None) -> str:
        """The op-level graph page of the run patched, each patched op painted by its effect."""
        return self.history.to_html(path, overlay=self.overlay(), focus=self.labels[0] if self.labels else None)

    def heatmap_svg(self, path: Optional[str] = None, recovered: bool = True, title: str = "") -> str:
        """A heat map (layers x positions; heads folded into rows) as SVG text, written to
        ``path`` when given. ``recovered``: the share of the clean metric brought back (else
        the metric itself)."""
        from .heatmap import heatmap_svg

        use = recovered and self.clean is not None and self.clean != self.corrupt
        values = self.recovered() if use else self.values
        rows = [str(r) for r in self.to_pandas().index]
        svg = heatmap_svg(
            values.reshape(-1, values.shape[-1]),
            rows,
            [str(c) for c in self.coords[self.dims[-1]]],
            title=title or ("share of the clean metric recovered" if use else "metric"),
        )
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(svg)
        return svg

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>" + self.heatmap_svg()

    def __repr__(self) -> str:
        axes = ", ".join(f"{d}: {len(self.coords[d])}" for d in self.dims)
        clean = f", clean={self.clean:.6g}" if self.clean is not None else ""
        return f"PatchGrid({axes}; corrupt={self.corrupt:.6g}{clean}; {self.seconds:.2f} s, {self.modes})"


__all__ = ["PatchGrid"]
