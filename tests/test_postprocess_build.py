"""postprocess/__init__.py on hand-built records: ``build_history`` (prune, passes, labels,
links, lookup wired together) and ``drop_unsaved``. The inventory is a stand-in
holding only what post-processing reads."""

from types import SimpleNamespace

import pytest
import torch
from postprocess_records import Records, site

from torchlens.trace.capture.run import PassResult
from torchlens.trace.postprocess import build_history, drop_unsaved
from torchlens.trace.records.tensor_log import ParentRef


def _result(
    r,
    module_outputs,
    module_pass_counts,
    param_info,
    placeholders=(),
    depths=None,
    save_gradients=False,
    module_types=None,
):
    types = module_types or {"": "Model", **{a: "Linear" for a in module_pass_counts}}
    inventory = SimpleNamespace(
        param_info=param_info, module_types=types, module_children={"": [a for a in types if a]}
    )
    return PassResult(
        records=r.entries,
        parent_refs=list(placeholders),
        module_pass_counts=module_pass_counts,
        module_frame_depths=depths or {},
        module_outputs=module_outputs,
        notes=[],
        save_gradients=save_gradients,
        inventory=inventory,
        model_name="Model",
        random_seed=7,
        elapsed=0.5,
    )


def _recurrent():
    """x -> fc -> fc -> relu(h, h) -> output, with an unused torch.rand before the loop and a
    ``ParentRef`` in the relu's saved arguments."""
    r = Records()
    x = r.input()
    r.op("rand")
    l1 = r.op("linear", x, params=("fc.weight", "fc.bias"), modules=(("fc", 1),), frames=site(10, 3))
    l2 = r.op("linear", l1, params=("fc.weight", "fc.bias"), modules=(("fc", 2),), frames=site(10, 3))
    l1.output_of_modules.append(("fc", 1))  # the module hook notes both this and module_outputs
    l2.output_of_modules.append(("fc", 2))
    ref = ParentRef(record=l2)  # the tracer's placeholder holds the record until labels exist
    act = r.op("maximum", l2, l2, frames=site(11), func_args=(ref, ref))
    out = r.output(act)
    result = _result(
        r,
        module_outputs={("fc", 1): [((), l1)], ("fc", 2): [((), l2)]},
        module_pass_counts={"fc": 2},
        param_info={"fc.weight": (torch.Size([3, 3]), 9, 36), "fc.bias": (torch.Size([3]), 3, 12)},
        placeholders=[ref],
    )
    return result, (x, l1, l2, act, out)


def test_build_history_labels_the_kept_records():
    result, _ = _recurrent()
    history = build_history(result)
    assert history.layer_labels == ["input_1_0", "linear_1_1:1", "linear_1_1:2", "maximum_1_2", "output_1_3"]
    assert [(e.operation_num, e.num_operations) for e in history] == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert (history.model_name, history.random_seed, history.pass_time) == ("Model", 7, 0.5)


def test_build_history_links_parents_and_children_by_label():
    result, (x, l1, l2, act, out) = _recurrent()
    build_history(result)
    assert [(e.parent_layers, e.child_layers) for e in (x, l1, l2, act, out)] == [
        ([], ["linear_1_1:1"]),
        (["input_1_0"], ["linear_1_1:2"]),
        (["linear_1_1:1"], ["maximum_1_2"]),
        (["linear_1_1:2"], ["output_1_3"]),
        (["maximum_1_2"], []),
    ]
    assert act.parent_arg_positions == {"linear_1_1:2": [0, 1]}  # one parent, both arguments
    assert all(not e.parent_refs for e in (x, l1, l2, act, out))  # records are dropped afterwards


def test_build_history_resolves_parent_placeholders_to_labels():
    result, (*_, act, _out) = _recurrent()
    build_history(result)
    assert [ref.label for ref in act.func_args] == ["linear_1_1:2", "linear_1_1:2"]


def test_build_history_describes_parameters_and_module_outputs():
    result, (_x, l1, l2, act, _out) = _recurrent()
    history = build_history(result)
    assert (l1.param_shapes, l1.num_params, l1.param_bytes) == ([torch.Size([3, 3]), torch.Size([3])], 12, 48)
    assert (act.param_shapes, act.num_params, act.param_bytes) == ([], 0, 0)
    assert (l1.module_output_positions, l2.module_output_positions, act.module_output_positions) == (
        {("fc", 1): ()},
        {("fc", 2): ()},
        None,
    )
    assert history["fc:2"] is l2 and history["linear_1_1:1"] is l1 and history[-2] is act
    with pytest.raises(KeyError, match=r"'fc' names several layers \(module fc has 2 passes\).*'fc:1', 'fc:2'"):
        history["fc"]
    assert (history.modules.addresses, history.modules.passes) == (["fc"], {"fc": 2})


def test_build_history_keeps_a_branch_condition_only_when_it_was_kept():
    r = Records()
    x = r.input()
    s = r.op("sum", x, frames=site(10))
    gt = r.op("gt", s, frames=site(10, offset=2), bool_used=True)  # if x.sum() > 0:
    noise = r.op("rand", frames=site(12))
    coin = r.op("gt", noise, frames=site(12, offset=2), bool_used=True)  # if torch.rand(1) > 0.5: (pruned)
    a = r.op("relu", x, frames=site(11), branch_condition_record=gt)
    b = r.op("sin", a, frames=site(13), branch_condition_record=coin)
    r.output(b)
    history = build_history(_result(r, {}, {}, {}))
    assert history.layer_labels == ["input_1_0", "sum_1_1", "gt_1_2", "relu_1_3", "sin_1_4", "output_1_5"]
    assert noise not in history.layer_list and coin not in history.layer_list
    assert (a.branch_condition, b.branch_condition) == ("gt_1_2", None)


def test_build_history_notes_operations_inside_a_reentrant_checkpoint():
    from torch.utils.checkpoint import CheckpointFunction

    code = CheckpointFunction.forward.__code__
    r = Records()
    x = r.input()
    inside = r.op("sin", x, frames=(("forward", 10, 0), (code, 1, 0), ("forward", 3, 0)))
    r.output(inside)
    history = build_history(_result(r, {}, {}, {}, save_gradients=True))
    assert inside.gradient_note == "none: computed inside torch.utils.checkpoint(use_reentrant=True)"
    assert x.gradient_note is None
    assert len(history.notes) == 1 and history.notes[0].startswith("1 layers ran inside torch.utils.checkpoint")
    assert "(sin_1_1)" in history.notes[0]


def test_drop_unsaved_keeps_labels_and_renumbers_positions():
    result, (_x, _l1, l2, _act, out) = _recurrent()
    history = build_history(result)
    for e in (l2, out):
        e.activation = torch.zeros(3)
    same = drop_unsaved(history)
    assert same is history
    assert history.layer_labels == ["linear_1_1:2", "output_1_3"]
    assert (history[0], history[-1], history[1]) == (l2, out, out)  # positions among the kept entries
    assert (l2.operation_num, out.operation_num) == (3, 5)  # the place in the whole pass stays
    # with one pass left, the layer's label without pass (and the module) name that pass
    assert history["linear_1_1"] is l2 and history["fc"] is l2 and history["fc:2"] is l2
    with pytest.raises(KeyError, match="'linear_1_1:1' ran but was not kept because its activation was not saved"):
        history["linear_1_1:1"]
    assert history.num_tensors == 5  # the summary still describes the whole pass


def test_a_tensor_returned_twice_by_one_module_call_keeps_its_first_position():
    # return y, y: the module hook records both positions; the first one names the tensor
    r = Records()
    x = r.input()
    y = r.op("sin", x, modules=(("pair", 1),), frames=site(10))
    y.output_of_modules += [("pair", 1), ("pair", 1)]
    r.output(y, "output.0")
    r.output(y, "output.1")
    history = build_history(
        _result(r, {("pair", 1): [((0,), y), ((1,), y)]}, {"pair": 1}, {}, module_types={"": "Model", "pair": "Pair"})
    )
    assert y.module_output_positions == {("pair", 1): (0,)}
    assert history["pair"] is y and history["pair:1"] is y and history["pair:1.0"] is y
    assert "pair:1.1" not in history
