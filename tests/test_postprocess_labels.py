"""postprocess/labels.py on hand-built records: labels and the outputs of one call.

``<type>_<k>_<n>``: k counts layers of the type, n counts layers overall from 0 (in order of
first pass); ``:<pass>`` only for layers with several passes. ``build_lookup`` is in
test_postprocess_lookup.py.
"""

from postprocess_records import Records, site

from torchlens.trace.history.index import output_key
from torchlens.trace.postprocess.graph import prune
from torchlens.trace.postprocess.labels import assign_labels, link_call_outputs


def _fields(e):
    return (e.label, e.layer_label, e.short_label, e.type_index, e.layer_index, e.pass_num, e.num_passes)


# ----- assign_labels -----------------------------------------------------------------------
def test_single_pass_layers_get_type_count_and_position():
    r = Records()
    x = r.input()
    c1 = r.op("conv2d", x, params=("c1.weight",))
    a1 = r.op("relu", c1)
    c2 = r.op("conv2d", a1, params=("c2.weight",))
    a2 = r.op("relu", c2)
    out = r.output(a2)
    assign_labels([[x], [c1], [a1], [c2], [a2], [out]])
    assert [_fields(e) for e in r.entries] == [
        ("input_1_0", "input_1_0", "input_1", 1, 0, 1, 1),
        ("conv2d_1_1", "conv2d_1_1", "conv2d_1", 1, 1, 1, 1),
        ("relu_1_2", "relu_1_2", "relu_1", 1, 2, 1, 1),
        ("conv2d_2_3", "conv2d_2_3", "conv2d_2", 2, 3, 1, 1),
        ("relu_2_4", "relu_2_4", "relu_2", 2, 4, 1, 1),
        ("output_1_5", "output_1_5", "output_1", 1, 5, 1, 1),
    ]


def test_a_layer_with_several_passes_gets_a_pass_suffix():
    r = Records()
    x = r.input()
    h, fcs = x, []
    for _ in range(3):
        h = r.op("linear", h, params=("fc.weight",))
        fcs.append(h)
    out = r.output(h)
    assign_labels([[x], fcs, [out]])
    assert [_fields(e) for e in fcs] == [
        ("linear_1_1:1", "linear_1_1", "linear_1", 1, 1, 1, 3),
        ("linear_1_1:2", "linear_1_1", "linear_1", 1, 1, 2, 3),
        ("linear_1_1:3", "linear_1_1", "linear_1", 1, 1, 3, 3),
    ]
    assert out.label == "output_1_2"  # n counts layers, not operations


def test_counts_are_per_layer_not_per_pass():
    r = Records()
    x = r.input()
    a1 = r.op("linear", x, params=("a.weight",))
    b = r.op("linear", a1, params=("b.weight",))
    a2 = r.op("linear", b, params=("a.weight",))
    s = r.op("sin", a2)
    assign_labels([[x], [a1, a2], [b], [s]])
    assert [e.label for e in r.entries] == ["input_1_0", "linear_1_1:1", "linear_2_2", "linear_1_1:2", "sin_1_3"]


def test_inputs_buffers_and_outputs_are_numbered_like_any_layer():
    r = Records()
    x = r.input("x")
    y = r.input("y")
    b = r.buffer("bn.running_mean", modules=(("bn", 1),))
    s = r.op("add", x, y, b)
    o1 = r.output(s, "output.0")
    o2 = r.output(x, "output.1")
    assign_labels([[e] for e in r.entries])
    assert [e.label for e in (x, y, b, s, o1, o2)] == [
        "input_1_0",
        "input_2_1",
        "buffer_1_2",
        "add_1_3",
        "output_1_4",
        "output_2_5",
    ]


def test_labels_follow_the_order_of_the_layers_given():
    # n is the position in the list (group_passes sorts it by first pass), not the raw index
    r = Records()
    x = r.input()
    a = r.op("sin", x)
    b = r.op("cos", x)
    assign_labels([[x], [b], [a]])
    assert (b.label, a.label) == ("cos_1_1", "sin_1_2")


# ----- output_key ----------------------------------------------------------------------------
def test_output_keys_name_one_output_of_one_module_call():
    assert output_key("lstm", 1, 0) == "lstm:1.0"
    assert output_key("lstm", 1, (1, 0)) == "lstm:1.1.0"
    assert output_key("block", 2, "hidden") == "block:2.hidden"
    assert output_key("block", 2, ("out", 3)) == "block:2.out.3"


# ----- link_call_outputs -------------------------------------------------------------------
def _lstm_call(r, parent, frames, n_outputs=3, func=max):
    return [r.op("lstm", parent, func=func, frames=frames, output_index=(i,)) for i in range(n_outputs)]


def _label_each(entries):
    assign_labels([[e] for e in entries])


def test_the_outputs_of_one_call_list_each_other():
    r = Records()
    x = r.input()
    outs = _lstm_call(r, x, site(10))
    r.output(outs[0])
    _label_each(r.entries)
    link_call_outputs(r.entries, r.entries)
    assert [e.call_outputs for e in outs] == [["lstm_1_1", "lstm_2_2", "lstm_3_3"]] * 3
    assert x.call_outputs is None and r.entries[-1].call_outputs is None


def test_pruned_outputs_of_a_call_are_left_out():
    r = Records()
    x = r.input()
    c = r.op("ones")
    frames = site(10)  # the tracer gives all outputs of one call the same call-stack object
    values, indices = (r.op("max", c, func=max, frames=frames, output_index=i) for i in range(2))
    frames = site(11)
    both = [r.op("max", x, func=max, frames=frames, output_index=i) for i in range(2)]
    r.output(both[0], "output.0")
    r.output(values, "output.1")  # indices of the constant's max: never used, dropped
    kept = prune(r.entries)
    assert indices not in kept
    _label_each(kept)
    link_call_outputs(r.entries, kept)
    assert values.call_outputs is None  # the only kept output of its call
    assert [e.call_outputs for e in both] == [[both[0].label, both[1].label]] * 2


def test_two_calls_in_a_row_at_one_site_are_two_groups():
    # a loop calling torch.max(x, 1) twice: the second call starts again at output 0
    r = Records()
    x = r.input()
    frames = site(10)
    first = [r.op("max", x, func=max, frames=frames, output_index=i) for i in range(2)]
    second = [r.op("max", first[0], func=max, frames=frames, output_index=i) for i in range(2)]
    _label_each(r.entries)
    link_call_outputs(r.entries, r.entries)
    assert [e.call_outputs for e in first + second] == [["max_1_1", "max_2_2"]] * 2 + [["max_3_3", "max_4_4"]] * 2


def test_outputs_of_different_calls_or_sites_do_not_group():
    r = Records()
    x = r.input()
    a = r.op("max", x, func=max, frames=site(10), output_index=0)
    b = r.op("max", x, func=max, frames=site(10), output_index=1)  # equal, but not the same call stack object
    c = r.op("min", x, func=min, frames=a.call_frames, output_index=1)  # another function
    single = r.op("relu", x, func=abs, frames=a.call_frames)  # a single output ends any group
    d = r.op("max", x, func=max, frames=a.call_frames, output_index=1)
    _label_each(r.entries)
    link_call_outputs(r.entries, r.entries)
    assert [e.call_outputs for e in (a, b, c, single, d)] == [None] * 5


def test_outputs_of_one_call_must_be_consecutive_records():
    r = Records()
    x = r.input()
    frames = site(10)
    a = r.op("max", x, func=max, frames=frames, output_index=0)
    r.op("relu", x, func=abs, frames=site(11))
    b = r.op("max", x, func=max, frames=frames, output_index=1)
    _label_each(r.entries)
    link_call_outputs(r.entries, r.entries)
    assert (a.call_outputs, b.call_outputs) == (None, None)
