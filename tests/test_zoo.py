"""The model zoo: real architectures with random weights (``tests/zoo_models.py``).

For every model of the zoo:

* the number of logged operations is the same in two metadata-only passes
  (``len(tl.log_forward_pass(model, ..., layers_to_save=None, random_seed=0))``);
* no holes (``tests/trace_holes.py``): every tensor that entered a logged operation was logged
  or alive before the pass, so no operation lost the parent it was computed from and no
  untraced producer was needed. A hole fails the test even where validation is an xfail;
* ``tl.validate_model_activations(model, ..., random_seed=0)`` is True: the logged outputs equal
  those of a plain run, every operation replays exactly from its saved parents, and every edge
  is a real dependency.

Models whose test takes ``zoo_models.SLOW_SECONDS`` or more are marked ``slow`` (CI runs them;
``-m 'not slow'`` deselects them). Models that fail because of a known torchlens bug are marked
``xfail(strict=True, raises=ValidationFailed)`` with the reason: an unstable count or a crash
inside torchlens still fails the test, and a fixed bug shows up as an XPASS (a failure) so that
the mark gets removed. ``benchmarks/zoo_table.py`` prints the same checks as a table with timings.
"""

from __future__ import annotations

import pytest
import torch
from trace_holes import holes, tensors_alive
from zoo_models import TV_CLASSIFICATION_LEFT_OUT, ZOO, ZooModel, tv_classification_names

import torchlens as tl


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The zoo runs with one intra-op thread. On the 2-core CI machine two threads gain nothing for
    these small inputs, and whenever another process holds a core a 2-thread OpenMP pool stalls
    (measured: crossvit 1.1 s -> 61 s, convmixer 1.1 s -> 41 s with a second process busy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class ValidationFailed(Exception):
    """``validate_model_activations`` returned False (its report is in the captured stdout)."""


def _params():
    for entry in ZOO:
        marks = []
        if entry.slow:
            marks.append(pytest.mark.slow)
        if entry.xfail:
            marks.append(pytest.mark.xfail(strict=True, raises=ValidationFailed, reason=entry.xfail))
        yield pytest.param(entry, id=entry.name, marks=marks)


@pytest.mark.parametrize("entry", list(_params()))
def test_zoo_model(entry: ZooModel):
    model, args, kwargs = entry.build()
    alive = tensors_alive()
    first = tl.log_forward_pass(
        model, list(args), kwargs or None, layers_to_save=None, random_seed=0, save_function_args=True
    )
    found = holes(first, alive)
    assert not found, f"{entry.name}: {len(found)} holes in the trace: " + "; ".join(found[:5])
    counts = [
        len(first),
        len(tl.log_forward_pass(model, list(args), kwargs or None, layers_to_save=None, random_seed=0)),
    ]
    del alive, first
    assert counts[0] == counts[1], f"{entry.name}: {counts[0]} operations, then {counts[1]}"
    assert counts[0] > 2, f"{entry.name}: only {counts[0]} layers logged"
    # verbose: the report of a failure goes to the captured stdout, shown with the failure
    if not tl.validate_model_activations(model, list(args), kwargs or None, random_seed=0, verbose=True):
        raise ValidationFailed(f"{entry.name}: validate_model_activations returned False")


def test_zoo_covers_torchvision_classification():
    """Every classification model of this torchvision is in the zoo or left out with a reason."""
    names = set(tv_classification_names())
    in_zoo = {e.name[len("tv.") :] for e in ZOO if e.family == "classification" and not e.name.endswith(".train")}
    assert not in_zoo & set(TV_CLASSIFICATION_LEFT_OUT), "a model is both in the zoo and left out"
    missing = names - in_zoo - set(TV_CLASSIFICATION_LEFT_OUT)
    assert not missing, f"torchvision classification models neither in the zoo nor left out: {sorted(missing)}"


def test_zoo_names_unique_and_families_known():
    from zoo_models import FAMILIES

    names = [e.name for e in ZOO]
    assert len(names) == len(set(names))
    assert {e.family for e in ZOO} <= set(FAMILIES)
    assert all(e.xfail is None or e.xfail.strip() for e in ZOO)


def test_zoo_builds_are_deterministic():
    """Two builds of an entry give the same weights and inputs (the zoo tests rely on it)."""
    entry = next(e for e in ZOO if e.name == "nn.LSTM.packed")
    (m1, a1, _), (m2, a2, _) = entry.build(), entry.build()
    for p1, p2 in zip(m1.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(p1, p2)
    for x1, x2 in zip(a1, a2):
        assert torch.equal(x1, x2)
