"""postprocess/graph.py on hand-built records: pruning, the created-inside flag, children.

The rule (``prune``'s docstring): keep inputs, outputs, everything computed from an input (or
from an ``untraced`` node) and every ancestor of a kept record; drop the rest.
"""

import pickle

import pytest
import torch
from postprocess_records import Records, raw

import torchlens as tl
from torchlens.trace.postprocess.graph import children_of, prune


# ----- what is kept ------------------------------------------------------------------------
def test_a_chain_from_input_to_output_is_kept_whole_and_in_order():
    r = Records()
    x = r.input()
    fc = r.op("linear", x, params=("fc.weight", "fc.bias"))
    act = r.op("relu", fc)
    out = r.output(act)
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 2, 3]
    assert all(k is e for k, e in zip(kept, [x, fc, act, out]))


def test_an_unused_tensor_made_inside_the_model_is_dropped():
    r = Records()
    x = r.input()
    r.op("rand")  # torch.rand(3) never used
    act = r.op("relu", x)
    r.output(act)
    assert raw(prune(r.entries)) == [0, 2, 3]


def test_a_buffer_update_that_feeds_nothing_is_dropped_with_its_buffer():
    r = Records()
    x = r.input()
    mean = r.buffer("bn.running_mean", modules=(("bn", 1),))
    scaled = r.op("mul", mean, modules=(("bn", 1),))  # running_mean * momentum ...
    r.op("add", scaled, modules=(("bn", 1),), stored_as_buffer="bn.running_mean")  # ... stored back
    act = r.op("relu", x)
    r.output(act)
    assert raw(prune(r.entries)) == [0, 4, 5]


def test_a_dead_end_computed_from_an_input_is_kept():
    # not "only what leads to an output": the docstring keeps everything computed from an input
    r = Records()
    x = r.input()
    r.op("sum", x)  # computed, never used
    act = r.op("relu", x)
    r.output(act)
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 2, 3]
    assert [e.created_inside_model for e in kept] == [False, False, False, False]


def test_an_unused_input_is_kept():
    r = Records()
    x = r.input("x")
    r.input("unused")
    r.output(r.op("relu", x))
    assert raw(prune(r.entries)) == [0, 1, 2, 3]


def test_every_ancestor_of_a_kept_record_is_kept_however_deep():
    r = Records()
    x = r.input()
    c0 = r.op("ones")
    c1 = r.op("mul", c0)
    c2 = r.op("add", c1)
    y = r.op("add", x, c2)
    r.output(y)
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 2, 3, 4, 5]
    assert [e.created_inside_model for e in kept] == [False, True, True, True, False, False]


def test_a_constant_feeding_a_dead_end_from_an_input_is_kept():
    r = Records()
    x = r.input()
    c = r.op("ones")
    r.op("add", x, c)  # dead end, but computed from x: kept, so its parent c is kept too
    r.output(r.op("relu", x))
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 2, 3, 4]
    assert kept[1].created_inside_model is True


def test_a_dead_end_made_inside_from_a_kept_constant_is_dropped():
    r = Records()
    x = r.input()
    c = r.op("ones")
    r.op("mul", c)  # c * 2, never used and not computed from x
    y = r.op("add", x, c)
    r.output(y)
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 3, 4]
    assert children_of(kept)[c.raw_index] == [y]


def test_an_output_made_of_constants_keeps_its_ancestors():
    r = Records()
    r.input()  # the model ignores its input
    z = r.op("zeros")
    w = r.op("add", z)
    r.output(w)
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 2, 3]
    assert [e.created_inside_model for e in kept] == [False, True, True, False]


def test_an_output_without_a_parent_is_kept():
    r = Records()
    x = r.input()
    r.output(r.op("relu", x), address="output.0")
    r.output(None, address="output.1")
    assert raw(prune(r.entries)) == [0, 1, 2, 3]


def test_an_untraced_node_counts_as_a_source():
    r = Records()
    x = r.input()
    u = r.untraced()
    v = r.op("mul", u)  # fed only by the untraced node, used by nothing
    r.output(r.op("relu", x))
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 2, 3, 4]
    assert (u.created_inside_model, v.created_inside_model) == (False, False)


def test_buffers_are_not_created_inside_but_what_only_buffers_feed_is():
    r = Records()
    x = r.input()
    b = r.buffer("scale")
    y = r.op("mul", x, b)
    s = r.op("mul", b)  # from the buffer alone
    r.output(y, "output.0")
    r.output(s, "output.1")
    kept = prune(r.entries)
    assert raw(kept) == [0, 1, 2, 3, 4, 5]
    assert [e.created_inside_model for e in kept] == [False, False, False, True, False, False]


def test_prune_returns_a_new_list_and_leaves_dropped_records_unflagged():
    r = Records()
    x = r.input()
    dropped = r.op("rand")
    r.output(r.op("relu", x))
    before = list(r.entries)
    kept = prune(r.entries)
    assert kept is not r.entries
    assert r.entries == before
    assert dropped.created_inside_model is None


# ----- children ----------------------------------------------------------------------------
def _diamond():
    r = Records()
    x = r.input()
    a = r.op("sin", x)
    b = r.op("cos", x)
    c = r.op("add", a, b)
    out = r.output(c)
    return r, (x, a, b, c, out)


def test_children_of_a_diamond():
    r, _ = _diamond()
    children = children_of(r.entries)
    assert {k: raw(v) for k, v in children.items()} == {0: [1, 2], 1: [3], 2: [3], 3: [4], 4: []}


def test_children_mirror_parents():
    r, _ = _diamond()
    y = r.op("mul", r.entries[3], r.entries[0])  # one more edge back to the input
    r.output(y, "output.1")
    children = children_of(r.entries)
    edges_from_parents = sorted((p.raw_index, e.raw_index) for e in r.entries for p, _ in e.parent_refs)
    edges_from_children = sorted((k, c.raw_index) for k, cs in children.items() for c in cs)
    assert edges_from_parents == edges_from_children == [(0, 1), (0, 2), (0, 5), (1, 3), (2, 3), (3, 4), (3, 5), (5, 6)]


def test_a_parent_used_twice_by_one_call_lists_the_child_once():
    r = Records()
    x = r.input()
    sq = r.op("mul", x, x)  # x * x
    r.output(sq)
    assert raw(children_of(r.entries)[x.raw_index]) == [1]


def test_children_are_in_execution_order_whatever_the_argument_order():
    r = Records()
    x = r.input()
    w = r.op("ones")
    first = r.op("add", w, x)  # x is the second argument
    second = r.op("add", x, w)
    third = r.op("neg", x)
    r.output(r.op("stack", third, second, first))
    children = children_of(r.entries)
    assert raw(children[x.raw_index]) == [2, 3, 4]
    assert raw(children[w.raw_index]) == [2, 3]


def test_children_of_pruned_records_leave_out_what_was_dropped():
    r = Records()
    x = r.input()
    c = r.op("ones")
    r.op("mul", c)  # dropped
    y = r.op("add", x, c)
    r.output(y)
    children = children_of(prune(r.entries))
    assert sorted(children) == [0, 1, 3, 4]
    assert {k: raw(v) for k, v in children.items()} == {0: [3], 1: [3], 3: [4], 4: []}


# ----- fields post-processing sets ----------------------------------------------------------
def test_a_record_post_processing_never_reached_reads_none_for_its_fields_and_errors_on_typos():
    r = Records()
    x = r.input()
    dropped = r.op("rand")
    r.output(r.op("relu", x))
    assert dropped not in prune(r.entries)
    assert (dropped.label, dropped.child_layers, dropped.num_params, dropped.lookup_keys) == (None, None, None, None)
    assert dropped.parent_refs == [] and dropped.module_output_positions is None
    assert getattr(dropped, "_pending", "absent") == "absent"  # not a field: no default
    with pytest.raises(AttributeError, match="has no attribute 'labell'"):
        dropped.labell  # noqa: B018 - the read is the test


# what post-processing sets on every record it keeps (the others are set where they apply)
_ALWAYS_SET = (
    "label layer_label short_label type_index layer_index pass_num num_passes parent_layers child_layers "
    "parent_arg_positions param_shapes num_params param_bytes created_inside_model operation_num "
    "num_operations module_passes"
).split()


def test_post_processing_sets_its_fields_on_every_record_of_a_traced_pass_and_pickling_keeps_them():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    h = tl.log_forward_pass(model, torch.ones(2, 3))
    assert all(getattr(e, n) is not None for e in h for n in _ALWAYS_SET)
    copy = pickle.loads(pickle.dumps(h))
    assert [[getattr(e, n) for n in _ALWAYS_SET] for e in copy] == [[getattr(e, n) for n in _ALWAYS_SET] for e in h]
