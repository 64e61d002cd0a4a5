"""Two runs side by side on the explorer page: which calls each run has, and where their
series first differ (``Run.compare``), as the page's ``/api/pair`` route answers it; and the
catalog that ``torchlens explore RUN_A RUN_B`` serves (exactly those two runs).

Calls are matched by id (``'fc:1'``: module address and call number), the same key the page
pins; the page fetches each run's strips with ``/api/call_series`` and aligns them itself.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, List, Optional, Sequence

from ..store import DB_NAME, TOLERANCE, compare_runs
from .data import Catalog, NotFound


class PairCatalog(Catalog):
    """A catalog of exactly the run folders ``run_dirs`` (ids relative to their common folder,
    which never leaves the server), for ``torchlens explore RUN_A RUN_B``; ``pair`` is the ids.

    Example:
        >>> import tempfile
        >>> PairCatalog([tempfile.mkdtemp(), tempfile.mkdtemp()])
        Traceback (most recent call last):
        ...
        torchlens.train.serve.data.NotFound: ...is not a run folder written by tl.watch...
    """

    def __init__(self, run_dirs: Sequence[str]) -> None:
        paths = [os.path.abspath(p) for p in run_dirs]
        for path in paths:
            if not os.path.isfile(os.path.join(path, DB_NAME)):
                raise NotFound(
                    f"{path} is not a run folder written by tl.watch (no {DB_NAME} in it): give "
                    "two run folders (w.run_dir), or one folder of runs and pick two on the page."
                )
        if len(set(paths)) != len(paths):
            raise NotFound(f"the same run was given twice ({paths[0]}): give two different run folders.")
        common = os.path.commonpath(paths)
        if common in paths:  # one run inside the other: serve from the outer one's parent
            common = os.path.dirname(common)
        super().__init__(common)
        self.pair = [os.path.relpath(p, common) for p in paths]

    def run_ids(self) -> List[str]:
        return list(self.pair)

    def runs_json(self) -> dict:
        return {**super().runs_json(), "pair": list(self.pair)}


_cache_lock = threading.Lock()


def pair_json(catalog: Catalog, run_a: Optional[str], run_b: Optional[str], tolerance: float = TOLERANCE) -> dict:
    """What the page needs to show runs ``run_a`` and ``run_b`` together: each run's name, the
    calls only one of them has, the calls both have, and per call and series
    (``'kind/name'``) the first step where ``Run.compare`` finds the two differ.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> root = tempfile.mkdtemp()
        >>> for name, width in (("a", 2), ("b", 3)):
        ...     model = torch.nn.Sequential(torch.nn.Linear(3, width))
        ...     with tl.watch(model, run_dir=f"{root}/{name}", backend=(), verbose=False):
        ...         _ = model(torch.rand(4, 3))
        >>> answer = pair_json(Catalog(root), "a", "b")
        >>> answer["b"]["name"], answer["only_in_a"], answer["only_in_b"]
        ('b', [], [])
    """
    if run_b is None or run_b == "":
        raise NotFound("missing query parameter 'other': the run to compare with (an id from /api/runs)")
    a, b = catalog.run(run_a), catalog.run(run_b)
    id_a = run_a or "."
    key = (id_a, run_b, len(a.steps), len(b.steps), tolerance)
    with _cache_lock:  # comparing reads every column of both runs: once per new step is enough
        cache: Dict[tuple, dict] = catalog.__dict__.setdefault("_pairs", {})
        cached = cache.get(key)
    if cached is not None:
        return cached
    calls_a, calls_b = a.calls, b.calls
    differs: Dict[str, Dict[str, int]] = {}
    for c in compare_runs(a, b, tolerance=tolerance):
        if c.first_step is not None:
            differs.setdefault(c.call_id, {})[f"{c.kind}/{c.name}"] = int(c.first_step)
    name = lambda run_id: os.path.basename(os.path.join(catalog.root, run_id).rstrip("/.")) or run_id  # noqa: E731
    answer = {
        "a": {"id": id_a, "name": name(id_a), "model": a.model_name},
        "b": {"id": run_b, "name": name(run_b), "model": b.model_name},
        "only_in_a": [c for c in calls_a if c not in calls_b],
        "only_in_b": [c for c in calls_b if c not in calls_a],
        "both": [c for c in calls_a if c in calls_b],
        "differs": differs,
        "tolerance": tolerance,
    }
    with _cache_lock:
        if len(cache) > 64:
            cache.clear()
        cache[key] = answer
    return answer


__all__ = ["PairCatalog", "pair_json"]
