"""One logged step's series as the recorder hands them over: the parts each series got (a
sample, exact statistics and per-sample norms per tensor), made into one sample and one exact
summary per series on the writer thread (``StepData.summarize``)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import torch

from ...web.stats import Sample, Summary, as_tensor
from ..measure import LazySummary, combine_summaries, table_rows
from .sampling import NormsLater

Key = Tuple[str, str, str]  # (call id, kind, name)
# one tensor's contribution to a series: its sample (or the LazySummary that draws it from a
# copy), its exact_summary over all values (or the LazySummary that measures it later), and (for
# gradient series) all its per-sample norms, whose median is the series' line
Part = Tuple[
    Union[torch.Tensor, LazySummary, NormsLater],
    Optional[Union[torch.Tensor, LazySummary]],
    Optional[Union[torch.Tensor, NormsLater]],
]


class StepData:
    """One step's series: ``keys[i]`` has the first ``counts[i]`` parts of ``parts[i]`` (the
    recorder's list, which may grow after it was collected); after ``summarize()``, the sample
    ``samples[i]`` (for its histogram) and the ``exact_summary`` ``summaries[i]`` (over all values;
    None when there is none); ``reasons``: why the gradient series named there got no values.
    ``cache``: the step's summaries by series, kept while their parts stay the same (a step is
    written more than once): the count of parts and the last one, as lists only grow or are
    made anew; only ``summarize`` touches it, on one thread."""

    def __init__(self, cache: Optional[Dict[Key, Tuple[int, Part, Summary]]] = None) -> None:
        self.keys: List[Key] = []
        self.parts: List[List[Part]] = []
        self.counts: List[int] = []
        # where they lie: ``Piece``s of a phase's samples and ``Row``s of its table, mostly (the
        # histograms take them from there: no view per series)
        self.samples: List[Sample] = []
        self.summaries: List[Summary] = []
        self.reasons: Dict[Key, str] = {}
        self.cache = cache if cache is not None else {}

    def summarize(self) -> "StepData":
        """Fill ``samples`` and ``summaries`` from the parts (once)."""
        if len(self.samples) == len(self.keys):
            return self
        # the parts as collected (a slice: the training thread may append to the list meanwhile)
        series = [parts[:n] for parts, n in zip(self.parts, self.counts)]
        changed = []  # the series whose parts changed since their summary was computed
        for key, parts in zip(self.keys, series):
            known = self.cache.get(key)
            if known is None or known[0] != len(parts) or known[1] is not parts[-1]:
                changed.append((key, parts))
        LazySummary.resolve([p[1] for _, parts in changed for p in parts if isinstance(p[1], LazySummary)])
        for (key, parts), summary in zip(changed, _summaries_of([parts for _, parts in changed])):
            self.cache[key] = (len(parts), parts[-1], summary)
        self.samples = [
            _sample(parts[0]) if len(parts) == 1 else torch.cat([as_tensor(_sample(p)) for p in parts])
            for parts in series
        ]
        self.summaries = [self.cache[key][2] for key in self.keys]
        return self


def _sample(part: Part) -> Sample:
    """A part's sample: taken when its tensor was seen, or drawn from its copy (or its norms)
    since; as it lies (a ``Piece`` of a phase's samples: no view)."""
    sample = part[0]
    return sample.sample_ref() if isinstance(sample, (LazySummary, NormsLater)) else sample  # type: ignore[return-value]


def _norms(norms: Union[None, torch.Tensor, NormsLater]) -> Optional[Sample]:
    return norms.norms_ref() if isinstance(norms, NormsLater) else norms


def _summary(measured: Union[None, torch.Tensor, LazySummary]) -> Summary:
    return measured.summary_ref() if isinstance(measured, LazySummary) else measured


def _summaries_of(series: List[List[Part]]) -> List[Summary]:
    """The exact summary of each series from its parts; for per-sample norms, of all of them,
    with their median as the line (all such series at once)."""
    out: List[Summary] = [None] * len(series)
    norm_rows, norm_of = [], []
    for i, parts in enumerate(series):
        if parts[0][2] is not None:
            norms = [n for n in (_norms(p[2]) for p in parts) if n is not None]
            if norms:  # else none was measured (each was written over before it was read)
                norm_rows.append(norms[0] if len(norms) == 1 else torch.cat([as_tensor(n) for n in norms]))
                norm_of.append(i)
            continue
        if len(parts) == 1:  # most series: one tensor's summary is the series'
            out[i] = _summary(parts[0][1])
            continue
        measured = [as_tensor(_summary(p[1])) for p in parts]
        summaries = [m for m in measured if m is not None]
        out[i] = combine_summaries(summaries) if summaries else None
    for i, summary in zip(norm_of, table_rows(norm_rows, median_line=True) if norm_rows else []):
        out[i] = summary
    return out


__all__ = ["Key", "Part", "StepData"]
