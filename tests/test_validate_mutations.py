"""Mutation tests for ``validate_history``: a correct trace validates, and each corruption of it,
applied alone to a deep copy (see ``_copy``), makes validation fail with a report naming the corrupted layer.

The six kinds of mutation, each kept self-consistent wherever the history is redundant (both ends
of an edge, the ``ParentRef``s of the saved call, the argument positions, the lookup), so that a
check of what the trace claims catches it, not a bookkeeping slip of the test:

- ``swap_parents``: an operation consumed two of its parents in the other order.
- ``repoint_parent``: a parent is another, earlier tensor of the same shape.
- ``nudge_activation``: one element of a saved activation is off by a relative 1e-3.
- ``drop_edge``: a parent is missing from ``parent_layers`` (and positions), its child link gone.
- ``exchange_passes``: two passes of a recurrent layer carry each other's label and number.
- ``swap_activations``: two same-shaped layers hold each other's saved activation.

Every site of a kind in a trace is a mutant (spread-out samples of at most ``CAP`` where there are
more). Mutants that cannot change anything are not generated: the arguments of a commutative
function are not swapped, and no tensor is exchanged for one with equal values.

A report names a layer when one of its failures is about that layer. Inputs and buffers have no
replay of their own (their record is the only witness of their value), so a corrupted source is
named by the failing replay of a consumer that lists it among its parents.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import itertools
import re
from collections import Counter
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import pytest
import torch
from models import LoopWeighted, ResidualBlock
from torch import nn

import torchlens as tl
from examples.models import SimpleRecurrent
from torchlens.trace.history.model_history import ModelHistory
from torchlens.trace.records.tensor_log import ParentRef
from torchlens.trace.validate import validate_history

# a warning raised by this file's own code fails its test, as for torchlens (pyproject.toml)
pytestmark = pytest.mark.filterwarnings("error:::test_validate_mutations")

CAP = 25  # mutants per (model, kind) at most


# ----- models ------------------------------------------------------------------------------------
class MLP(nn.Module):
    """Linear layers, the middle two 8 -> 8 (same-shaped layers), and an ``nn.Identity``."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(6, 8),
            nn.ReLU(),
            nn.Linear(8, 8),
            nn.Identity(),
            nn.ReLU(),
            nn.Linear(8, 8),
            nn.Tanh(),
            nn.Linear(8, 3),
        )

    def forward(self, x):
        return self.net(x)


class TwoBranches(nn.Module):
    """Two same-shaped branches, merged by an operation that cares about argument order."""

    def __init__(self):
        super().__init__()
        self.left = nn.Linear(4, 4)
        self.right = nn.Linear(4, 4)

    def forward(self, x):
        a = torch.tanh(self.left(x))
        b = torch.sigmoid(self.right(x))
        return torch.cat([a, b], dim=-1) * 2


class ReturnsParameter(nn.Module):
    """Outputs that no logged operation made (a parameter, a constant): parentless pass-throughs."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(3))
        self.table = torch.rand(3)

    def forward(self, x):
        return x * 2, self.scale, self.table


def _with_running_stats(model: nn.Module, shape: Tuple[int, ...]) -> nn.Module:
    """Batch-norm statistics other than the fresh 0 and 1 (alike in every layer), then eval."""
    model.train()
    with torch.no_grad():
        for seed in (1, 2):
            model(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2 + 0.5)
    return model.eval()


def _resnet18() -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    return _with_running_stats(torchvision.models.resnet18(weights=None), (2, 3, 32, 32))


ALL = ("swap_parents", "repoint_parent", "nudge_activation", "drop_edge", "exchange_passes", "swap_activations")
NOT_RECURRENT = tuple(k for k in ALL if k != "exchange_passes")
ONE_TENSOR_PARENT = tuple(k for k in NOT_RECURRENT if k != "swap_parents")
RECURRENT = tuple(k for k in ALL if k != "swap_parents")

# name -> (model factory, input shape, the kinds of mutation its trace has sites for)
MODELS: Dict[str, Tuple[Callable[[], nn.Module], Tuple[int, ...], Tuple[str, ...]]] = {
    "mlp": (MLP, (2, 6), ONE_TENSOR_PARENT),
    "residual_block": (lambda: _with_running_stats(ResidualBlock(), (2, 3, 4, 4)), (1, 3, 4, 4), NOT_RECURRENT),
    "resnet18": (_resnet18, (1, 3, 32, 32), NOT_RECURRENT),
    "simple_recurrent": (SimpleRecurrent, (6, 5), RECURRENT),
    "loop_weighted": (LoopWeighted, (2, 4), RECURRENT),
    "two_branches": (TwoBranches, (3, 4), NOT_RECURRENT),
    "returns_parameter": (ReturnsParameter, (3,), ONE_TENSOR_PARENT),
}
CASES = [(model, kind) for model, (_, _, kinds) in MODELS.items() for kind in kinds]


def _trace(model_name: str, **options: Any) -> ModelHistory:
    """A trace with what ``validate_history`` needs: every layer, and each call's arguments."""
    make_model, shape, _ = MODELS[model_name]
    torch.manual_seed(0)
    model = make_model()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    return tl.log_forward_pass(model, x, layers_to_save="all", save_function_args=True, random_seed=0, **options)


@functools.lru_cache(maxsize=None)
def _base(model_name: str) -> ModelHistory:
    """The trace each mutant deep-copies; never changed itself. Saved tensors are detached (as
    in ``validate_model_activations``), which lets the history be deep-copied."""
    return _trace(model_name, detach_saved_tensors=True)


def _validate(h: ModelHistory) -> Tuple[bool, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        valid = validate_history(h, verbose=True)
    return valid, out.getvalue()


# ----- reading and rewriting a trace ---------------------------------------------------------------
def _map_refs(value: Any, rename: Callable[[str], str]) -> Any:
    """The saved arguments with each ``ParentRef``'s label renamed."""
    if isinstance(value, ParentRef):
        return ParentRef(rename(value.label))
    if type(value) in (list, tuple):
        return type(value)(_map_refs(v, rename) for v in value)
    if type(value) is dict:
        return {k: _map_refs(v, rename) for k, v in value.items()}
    return value


def _refs(value: Any) -> List[str]:
    if isinstance(value, ParentRef):
        return [value.label]
    if type(value) in (list, tuple):
        return [label for v in value for label in _refs(v)]
    if type(value) is dict:
        return [label for v in value.values() for label in _refs(v)]
    return []


def _rewire(e, rename: Callable[[str], str]) -> None:
    """Rename parents everywhere the entry names them (saved call, parents, positions)."""
    e.func_args = _map_refs(e.func_args, rename)
    e.func_kwargs = _map_refs(e.func_kwargs, rename)
    e.parent_layers = [rename(p) for p in e.parent_layers]
    e.parent_arg_positions = {rename(p): v for p, v in (e.parent_arg_positions or {}).items()}


def _alike(h: ModelHistory, a: str, b: str) -> bool:
    """Saved tensors of one shape and dtype but different values: exchanging them is no
    equivalent mutant."""
    x, y = h[a].activation, h[b].activation
    return (
        isinstance(x, torch.Tensor)
        and isinstance(y, torch.Tensor)
        and x.shape == y.shape
        and x.dtype == y.dtype
        and not torch.equal(x, y)
    )


def _spread(sites: list, cap: int = CAP) -> list:
    """At most ``cap`` of ``sites``, evenly spread, first and last included."""
    if len(sites) <= cap:
        return sites
    return [sites[round(i * (len(sites) - 1) / (cap - 1))] for i in range(cap)]


# Functions for which exchanging two arguments gives the same result.
COMMUTATIVE = frozenset(
    {
        "__add__",
        "__radd__",
        "add",
        "__iadd__",
        "add_",
        "__mul__",
        "__rmul__",
        "mul",
        "__imul__",
        "mul_",
        "maximum",
        "minimum",
        "__and__",
        "__or__",
        "__xor__",
        "eq",
        "ne",
        "__eq__",
        "__ne__",
    }
)


# ----- the mutations: sites of a trace (labels), and how to corrupt a copy at one ------------------
def _sites_swap_parents(h: ModelHistory) -> list:
    return [
        (e.label, p, q)
        for e in h
        if e.func_args is not None and e.func_name not in COMMUTATIVE
        for p, q in itertools.combinations([p for p in e.parent_layers if p in _refs((e.func_args, e.func_kwargs))], 2)
        if _alike(h, p, q)
    ]


def _swap_parents(h: ModelHistory, site: tuple) -> List[str]:
    label, p, q = site
    swap = {p: q, q: p}
    _rewire(h[label], lambda name: swap.get(name, name))  # the positions travel with the refs
    return [label]


def _sites_repoint_parent(h: ModelHistory) -> list:
    order = {e.label: i for i, e in enumerate(h)}
    return [
        (e.label, p, r.label)
        for e in h
        for p in e.parent_layers
        for r in h.layer_list[: order[e.label]]
        if r.kind != "output" and r.label not in e.parent_layers and _alike(h, p, r.label)
    ]


def _repoint_parent(h: ModelHistory, site: tuple) -> List[str]:
    label, p, r = site
    _rewire(h[label], lambda name: r if name == p else name)
    h[p].child_layers = [c for c in h[p].child_layers if c != label]
    h[r].child_layers = h[r].child_layers + [label]
    return [label]


def _sites_nudge_activation(h: ModelHistory) -> list:
    # an element below ~1e-3 may change by less than the replay's tolerance (1e-6 + 1e-4 relative)
    return [
        (e.label,)
        for e in h
        if isinstance(e.activation, torch.Tensor)
        and e.activation.is_floating_point()
        and e.activation.numel()
        and float(e.activation.abs().max()) > 1e-2
    ]


def _nudge_activation(h: ModelHistory, site: tuple) -> List[str]:
    e = h[site[0]]
    value = e.activation.clone(memory_format=torch.contiguous_format)
    flat = value.view(-1)
    i = int(flat.abs().argmax())
    flat[i] = flat[i] * (1 + 1e-3)
    e.activation = value
    return [e.label]


def _sites_drop_edge(h: ModelHistory) -> list:
    return [(e.label, p) for e in h for p in e.parent_layers]


def _drop_edge(h: ModelHistory, site: tuple) -> List[str]:
    label, p = site
    e = h[label]
    e.parent_layers = [q for q in e.parent_layers if q != p]
    e.parent_arg_positions = {q: v for q, v in e.parent_arg_positions.items() if q != p}
    h[p].child_layers = [c for c in h[p].child_layers if c != label]
    return [label]


def _sites_exchange_passes(h: ModelHistory) -> list:
    passes: Dict[str, List[str]] = {}
    for e in h:
        passes.setdefault(e.layer_label, []).append(e.label)
    return [pair for labels in passes.values() for pair in itertools.combinations(labels, 2)]


def _exchange_passes(h: ModelHistory, site: tuple) -> List[str]:
    one, two = h[site[0]], h[site[1]]
    swap = {one.label: two.label, two.label: one.label}
    rename = lambda name: swap.get(name, name)  # noqa: E731
    for e in h:
        _rewire(e, rename)
        e.child_layers = [rename(c) for c in e.child_layers]
        if e.call_outputs:
            e.call_outputs = [rename(c) for c in e.call_outputs]
    one.label, two.label = two.label, one.label
    one.pass_num, two.pass_num = two.pass_num, one.pass_num
    h._lookup[one.label], h._lookup[two.label] = one, two  # history[label] finds the entry that has it
    return [one.label, two.label]


def _sites_swap_activations(h: ModelHistory) -> list:
    return [(a.label, b.label) for a, b in itertools.combinations(h, 2) if _alike(h, a.label, b.label)]


def _swap_activations(h: ModelHistory, site: tuple) -> List[str]:
    a, b = h[site[0]], h[site[1]]
    a.activation, b.activation = b.activation, a.activation
    return [a.label, b.label]


MUTATIONS: Dict[str, Tuple[Callable[[ModelHistory], list], Callable[[ModelHistory, tuple], List[str]]]] = {
    "swap_parents": (_sites_swap_parents, _swap_parents),
    "repoint_parent": (_sites_repoint_parent, _repoint_parent),
    "nudge_activation": (_sites_nudge_activation, _nudge_activation),
    "drop_edge": (_sites_drop_edge, _drop_edge),
    "exchange_passes": (_sites_exchange_passes, _exchange_passes),
    "swap_activations": (_sites_swap_activations, _swap_activations),
}
assert tuple(MUTATIONS) == ALL


# ----- running mutants ----------------------------------------------------------------------------
def _names(report: str, label: str, is_source: bool) -> bool:
    """Some failure in ``report`` is about layer ``label`` (see the module docstring)."""
    if re.search(rf"^validate_model_activations: {re.escape(label)}[: ]", report, re.MULTILINE):
        return True
    return is_source and any(label in parents.split(", ") for parents in re.findall(r"its parents \(([^)]*)\)", report))


class Mutant(NamedTuple):
    site: tuple
    corrupted: Tuple[str, ...]
    valid: bool  # what validation said about the corrupted copy
    unnamed: Tuple[str, ...]  # corrupted layers the report says nothing about
    report: str

    @property
    def caught(self) -> bool:
        return not self.valid and not self.unnamed

    def describe(self) -> str:
        why = "validates True" if self.valid else f"report does not name {', '.join(self.unnamed)}"
        return f"{self.site}: {why}\n{self.report}"


def _copy(h: ModelHistory) -> ModelHistory:
    """A deep copy sharing only the parameters in saved calls, which no mutation or replay
    changes (copying ResNet-18's weights for each mutant would dominate the run)."""
    params = [p for e in h for p in _flat((e.func_args, e.func_kwargs)) if isinstance(p, nn.Parameter)]
    return copy.deepcopy(h, {id(p): p for p in params})


def _flat(value: Any) -> List[Any]:
    if type(value) in (list, tuple):
        return [x for v in value for x in _flat(v)]
    if type(value) is dict:
        return [x for v in value.values() for x in _flat(v)]
    return [value]


@functools.lru_cache(maxsize=None)
def _mutants(model_name: str, kind: str) -> Tuple[Mutant, ...]:
    """Every (sampled) site of ``kind`` in the model's trace, each applied to its own deep copy
    (cached: the score test counts the same mutants)."""
    base = _base(model_name)
    find, corrupt = MUTATIONS[kind]
    found = []
    for site in _spread(find(base)):
        h = _copy(base)
        corrupted = tuple(corrupt(h, site))
        valid, report = _validate(h)
        sources = {e.label for e in h if e.kind in ("input", "buffer")}
        unnamed = tuple(label for label in corrupted if not _names(report, label, label in sources))
        found.append(Mutant(site, corrupted, valid, unnamed, report))
    return tuple(found)


# ----- tests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_name", list(MODELS))
def test_uncorrupted_trace_validates(model_name):
    """The control: the trace every mutant starts from, and the plain trace, are valid."""
    for h in (_base(model_name), _trace(model_name)):
        valid, report = _validate(h)
        assert valid and report == "", report


@pytest.mark.parametrize("model_name, kind", CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_mutation_is_caught(model_name, kind):
    assert _validate(_base(model_name)) == (True, "")
    mutants = _mutants(model_name, kind)
    assert mutants, f"no site for {kind} in {model_name}"
    missed = [m.describe() for m in mutants if not m.caught]
    assert not missed, f"{len(missed)} of {len(mutants)} mutants missed:\n" + "\n".join(missed)


def test_mutation_score():
    """Mutants caught (validation False, the corrupted layers named) out of all, per kind."""
    caught, total = Counter(), Counter()
    for model_name, kind in CASES:
        for m in _mutants(model_name, kind):
            total[kind] += 1
            caught[kind] += m.caught
    lines = [f"{kind:18s} {caught[kind]:4d}/{total[kind]}" for kind in ALL]
    lines.append(
        f"{'mutation score':18s} {sum(caught.values()):4d}/{sum(total.values())}"
        f" = {sum(caught.values()) / sum(total.values()):.1%}"
    )
    print("\n" + "\n".join(lines))
    assert set(total) == set(ALL) and caught == total, "\n".join(lines)


def test_a_mutant_is_the_corruption_it_claims():
    """Spot checks of the rewriting, on the two-branch model and the recurrent one."""
    h = _copy(_base("two_branches"))
    _swap_parents(h, ("cat_1_5", "tanh_1_2", "sigmoid_1_4"))
    e = h["cat_1_5"]
    assert [r.label for r in e.func_args[0]] == e.parent_layers == ["sigmoid_1_4", "tanh_1_2"]
    assert e.parent_arg_positions == {"sigmoid_1_4": [(0, 0)], "tanh_1_2": [(0, 1)]}

    h = _copy(_base("simple_recurrent"))
    first = h.layer_list[1]
    assert _exchange_passes(h, ("linear_1_1:1", "linear_1_1:2")) == ["linear_1_1:2", "linear_1_1:1"]
    assert first.label == "linear_1_1:2" and first.pass_num == 2 and h["linear_1_1:2"] is first
    assert h["add_1_2:1"].parent_layers == ["linear_1_1:2"] and first.child_layers == ["add_1_2:1"]
    assert _base("simple_recurrent")["linear_1_1:1"].pass_num == 1  # the base is untouched


def test_a_parentless_pass_through_is_replayed():
    """A returned parameter or constant has no parent: its saved call holds the tensor it passed
    on, so a corrupted record of it is caught like any other."""
    h = _base("returns_parameter")
    outputs = [h[label] for label in h.output_layers]
    assert [o.parent_layers for o in outputs] == [["mul_1_1"], [], []]
    assert isinstance(outputs[0].func_args[0], ParentRef)
    assert [type(o.func_args[0]) for o in outputs[1:]] == [nn.Parameter, torch.Tensor]
    assert all(m.caught for m in _mutants("returns_parameter", "nudge_activation"))
