"""``tl.log_generate(layers_to_save=None)``: decode steps after the first of their input shapes are
recorded by the lean tracer (``capture/lean.py``) on the first one's structure.

Each such step must answer exactly what a full trace of the same step answers (labels, shapes,
dtypes, parents, module boxes, print, ``to_pandas``, lookups, the step page, ``save_to=``);
a step that ran differently must raise ``StepStructureError``, never give a wrong history.
"""

from __future__ import annotations

import re

import pytest
import torch

import torchlens as tl
from torchlens.trace.capture import lean as lean_module
from torchlens.trace.capture.run import PassSession, run_pass
from torchlens.trace.capture.save_plan import SavePlan
from torchlens.trace.generate import GenerateHistory, StepStructureError
from torchlens.trace.generate.page import steps_data
from torchlens.trace.records.tensor_log import _ALL_FIELDS, TensorLogEntry

transformers = pytest.importorskip("transformers")

from tiny_llms import MODELS  # noqa: E402
from tiny_llms import gpt2 as _gpt2  # noqa: E402

PROMPT = torch.tensor([[1, 2, 3]])
STEPS = 6
FIELDS = [f for f in _ALL_FIELDS if f != "elapsed"]  # all but timings


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def _options(**extra):
    return dict(max_new_tokens=STEPS, min_new_tokens=STEPS, pad_token_id=0, do_sample=False, random_seed=7, **extra)


@pytest.fixture
def lean_passes(monkeypatch):
    """How many passes the lean tracer ran (so a test knows its steps were lean, not traced)."""
    count = {"n": 0}

    class Counted(lean_module.LeanTracer):
        def __init__(self, *args, **kwargs):
            count["n"] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("torchlens.trace.capture.run.LeanTracer", Counted)
    return count


def _generate_both(model, **extra):
    lean = tl.log_generate(model, PROMPT, layers_to_save=None, **_options(**extra))
    full = tl.log_generate(model, PROMPT, layers_to_save=None, reuse_structure=False, **_options(**extra))
    assert torch.equal(lean.tokens, full.tokens)
    return lean, full


def _masked(text):
    return re.sub(r"\d+\.\d+(E[-+]\d+)?s", "<time>", text)


def _assert_same_history(a, b):
    """Every field of every entry (timings aside) and what the history answers."""
    assert a.layer_labels == b.layer_labels
    for ea, eb in zip(a, b):
        for field in FIELDS:
            assert getattr(ea, field) == getattr(eb, field), f"{ea.label}.{field}"
    assert (a.model_name, a.random_seed, a.notes) == (b.model_name, b.random_seed, b.notes)
    assert (a.pass_stats, a.modules, a.param_info) == (b.pass_stats, b.modules, b.param_info)
    assert a.lookup_keys() == b.lookup_keys()
    for key in a.lookup_keys() + list(range(-len(a), len(a))):
        found_a, found_b = a.lookup_value(key), b.lookup_value(key)
        if isinstance(found_a, TensorLogEntry):
            assert found_a is a[key] and found_a.label == found_b.label, key
        else:
            assert (found_a.what, found_a.labels, found_a.suggestions) == (
                found_b.what,
                found_b.labels,
                found_b.suggestions,
            )
    assert _masked(str(a)) == _masked(str(b))
    assert [_masked(str(e)) for e in a] == [_masked(str(e)) for e in b]
    frame_a, frame_b = a.to_pandas(), b.to_pandas()
    timing = [c for c in frame_a.columns if "time" in c or "elapsed" in c]
    assert frame_a.drop(columns=timing).equals(frame_b.drop(columns=timing))
    assert [r.label for r in a.layer_list_rolled] == [r.label for r in b.layer_list_rolled]


def test_lean_steps_equal_full_traces(model, lean_passes):
    lean, full = _generate_both(model)
    assert lean_passes["n"] == STEPS - 2  # the prefill and the first decode step are traced
    for step, (a, b) in enumerate(zip(lean.steps, full.steps)):
        _assert_same_history(a, b)
        assert all(e.activation is None for e in a)
    # the steps are their own: each has its own shapes (the cache grows), not the template's
    cats = [[e.shape for e in h if e.layer_type == "cat"] for h in lean.steps[1:]]
    assert cats[0] != cats[-1] and len({tuple(map(tuple, c)) for c in cats}) == STEPS - 1
    assert any("recorded leanly" in note for note in lean.notes)
    assert not any("recorded leanly" in note for note in full.notes)


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if "time" not in k and k != "elapsed"}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def test_step_page_data_equals_full_traces(model):
    lean, full = _generate_both(model)
    for structure in (1, STEPS - 1):
        assert _without_times(steps_data(lean, structure)) == _without_times(steps_data(full, structure))


def test_save_to_streams_lean_steps(model, tmp_path, lean_passes):
    lean = tl.log_generate(model, PROMPT, layers_to_save=None, save_to=str(tmp_path / "lean"), **_options())
    full = tl.log_generate(
        model, PROMPT, layers_to_save=None, reuse_structure=False, save_to=str(tmp_path / "full"), **_options()
    )
    assert lean_passes["n"] == STEPS - 2
    loaded_lean, loaded_full = (
        GenerateHistory.load(str(tmp_path / "lean")),
        GenerateHistory.load(str(tmp_path / "full")),
    )
    for a, b, in_memory in zip(loaded_lean.steps, loaded_full.steps, lean.steps):
        assert a.layer_labels == b.layer_labels == in_memory.layer_labels
        for ea, eb in zip(a, b):
            assert (ea.shape, ea.dtype, ea.nbytes, ea.parent_layers, ea.child_layers, ea.module_stack) == (
                eb.shape,
                eb.dtype,
                eb.nbytes,
                eb.parent_layers,
                eb.child_layers,
                eb.module_stack,
            )
            assert [str(f) for f in ea.func_call_stack] == [str(f) for f in eb.func_call_stack]
        assert _masked(str(a)) == _masked(str(b))


class _Switch:
    """Runs ``change`` in a module's forward from the ``at``-th call of it on."""

    def __init__(self, module, at, change):
        self.calls, self.at, self.change = 0, at, change
        self.forward = module.forward
        module.forward = self

    def __call__(self, x, *args, **kwargs):
        self.calls += 1
        out = self.forward(x, *args, **kwargs)
        return self.change(out) if self.calls >= self.at else out


def _same_op_elsewhere(out):
    return torch.relu(out)  # a line of its own: the call site differs from _relu's


def _relu(out):
    return torch.relu(out)


@pytest.mark.parametrize(
    "change, what",
    [
        (lambda out: out * 1.0, "function"),  # one more operation
        (lambda out: torch.relu(out), "call site"),  # the same operation, from another line
    ],
    ids=["other-operation", "other-call-site"],
)
def test_a_step_that_ran_differently_raises(change, what):
    """Same modules, same input shapes, other operations: StepStructureError names the step and the
    operation, the model and torch are as before."""
    model = _gpt2()
    head = model.lm_head
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # the first decode step (the template) applies _relu, from step 3 on the change is applied instead
    _Switch(head, 1, lambda out: _relu(out) if head.forward.calls < 4 else change(out))
    with pytest.raises(StepStructureError, match=rf"step 3 .*step 1.*({what}).*reuse_structure=False"):
        tl.log_generate(model, PROMPT, layers_to_save=None, **_options())
    assert "forward" not in vars(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.relu is torch._C._VariableFunctions.relu
    # traced step by step, the same generation works
    gen = tl.log_generate(model, PROMPT, layers_to_save=None, reuse_structure=False, **_options())
    assert len(gen.steps) == STEPS


def test_a_step_whose_operation_has_other_parents_raises():
    model = _gpt2()
    head = model.lm_head

    # the same operations from the same lines; from step 3 on, add's arguments are swapped
    def swap(out):
        twice = out * 2
        return torch.add(*((out, twice) if head.forward.calls < 4 else (twice, out)))

    _Switch(head, 1, swap)
    with pytest.raises(StepStructureError, match=r"step 3 .*'add'.*differ in: parents\)"):
        tl.log_generate(model, PROMPT, layers_to_save=None, **_options())


def test_lean_pass_records_what_a_full_pass_records():
    """capture level: the same records, in the same order, for a model with buffers, a composite
    function, an in-place write through a view and a module returning its input."""

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(4)  # F.layer_norm calls torch.layer_norm: one record
            self.register_buffer("scale", torch.full((4,), 2.0))
            self.same = torch.nn.Identity()

        def forward(self, x):
            y = self.norm(x) * self.scale
            y[0].add_(1.0)  # written through a view: the base gets a record too
            h, c = torch.split(y, 2, dim=1)
            if h.sum() > -1e9:
                h = h + 1
            return self.same(h), c

    model = Odd()
    session = PassSession()
    full = run_pass(model, (torch.ones(3, 4),), {}, SavePlan(), random_seed=0, session=session)
    lean = run_pass(model, (torch.ones(5, 4),), {}, SavePlan(), random_seed=0, lean=True, session=session)
    assert lean_module.signature(lean.records) == lean_module.signature(full.records)
    assert [r.func_name for r in lean.records] == [r.func_name for r in full.records]
    assert [tuple(r.shape)[:1] for r in lean.records if r.kind == "op" and r.func_name != "sum"][0] == (5,)
    assert any(r.func_name == "write_through_view" for r in lean.records) and any(r.bool_used for r in lean.records)
    with pytest.raises(ValueError, match="metadata only"):
        run_pass(model, (torch.ones(2, 4),), {}, SavePlan(save_all=True), random_seed=0, lean=True)


def test_pass_session_follows_changes_of_the_model():
    """A session's inventory is made again when a module is replaced, and torch functions the
    model's code bound to its own names are wrapped at every pass of the session."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    session = PassSession()
    first = run_pass(model, (torch.ones(1, 2),), {}, SavePlan(), random_seed=0, session=session)
    model[1] = torch.nn.Tanh()
    second = run_pass(model, (torch.ones(1, 2),), {}, SavePlan(), random_seed=0, session=session)
    assert [r.layer_type for r in first.records] == ["input", "linear", "relu", "output"]
    assert [r.layer_type for r in second.records] == ["input", "linear", "tanh", "output"]
    assert session.inventory_of(model).module_types["1"] == "Tanh"


def _original(name="relu"):
    return getattr(torch, name) is getattr(torch._C._VariableFunctions, name)


def test_held_wrappers_stay_between_passes_and_are_restored():
    """HeldWrappers: torch is wrapped (inactive) between its passes, other threads' passes and
    nested blocks run inside it, released() gives torch as outside passes, and the end of the
    block (even by an error) restores torch exactly."""
    import threading

    from torchlens.trace.capture import ops
    from torchlens.trace.capture.run import HeldWrappers

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    found = {}

    def other_thread():
        found["other"] = [
            r.layer_type for r in run_pass(model, (torch.ones(1, 2),), {}, SavePlan(), random_seed=0).records
        ]

    with pytest.raises(RuntimeError, match="stop"):
        with HeldWrappers() as held:
            assert not _original() and torch.relu(torch.ones(1)).item() == 1.0  # inactive: torch's result
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
            assert not _original()  # the other pass left the held wrappers in place
            with HeldWrappers():
                mine = [
                    r.layer_type for r in run_pass(model, (torch.ones(1, 2),), {}, SavePlan(), random_seed=0).records
                ]
            assert not _original()
            with held.released():
                assert _original() and ops.ACTIVE.installed is None
            assert not _original() and ops.ACTIVE.holders == 1
            raise RuntimeError("stop")
    assert found["other"] == mine == ["input", "linear", "relu", "output"]
    assert _original() and _original("add") and ops.ACTIVE.installed is None and ops.ACTIVE.holders == 0
    assert torch.nn.functional.relu.__module__ == "torch.nn.functional"


def test_set_aside_and_put_back_restore_every_hold():
    from torchlens.trace.capture import decorate, ops

    table = decorate.current_wrapper_table()
    ops.install(table)
    ops.install(table)
    try:
        holders = ops.set_aside(table)
        assert holders == 2 and _original() and ops.ACTIVE.installed is None
        ops.put_back(table, holders)
        assert not _original() and ops.ACTIVE.holders == 2
    finally:
        ops.uninstall(table)
        ops.uninstall(table)
    assert _original() and ops.ACTIVE.installed is None
