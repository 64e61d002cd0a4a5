"""postprocess/passes.py on hand-built records: which operations are passes of one layer.

The rule is in the module's docstring: weighted operations are keyed by (type, parameter
objects, output position); parameter-free ones by call site (function, module addresses, call
stack from the innermost weighted module's ``forward``, output position) and split by their
anchor, the latest weighted ancestor; inputs, outputs and buffers are layers of their own.
"""

from postprocess_records import Records, layer_ids, site

from torchlens.trace.postprocess.labels import assign_labels
from torchlens.trace.postprocess.recurrent_passes import group_passes

FC = ("fc.weight", "fc.bias")


def conv_params(i):
    return (f"convs.{i}.weight", f"convs.{i}.bias")


# ----- weighted operations: the same parameter objects -------------------------------------
def test_a_loop_reusing_one_linear_is_one_layer_with_n_passes():
    r = Records()
    h = x = r.input()
    fcs = []
    for n in range(1, 4):
        h = r.op("linear", h, params=FC, modules=(("fc", n),), frames=site(10, 3))
        fcs.append(h)
    out = r.output(h)
    layers = group_passes(r.entries)
    assert layer_ids(layers) == layer_ids([[x], fcs, [out]])
    assign_labels(layers)
    assert [e.label for e in r.entries] == ["input_1_0", "linear_1_1:1", "linear_1_1:2", "linear_1_1:3", "output_1_2"]
    assert [(e.pass_num, e.num_passes) for e in fcs] == [(1, 3), (2, 3), (3, 3)]


def test_tied_weights_used_at_two_call_sites_are_one_layer():
    r = Records()
    x = r.input()
    a = r.op("linear", x, params=("emb.weight",), modules=(("head", 1),), frames=site(10, 3))
    b = r.op("linear", a, params=("emb.weight",), modules=(("decoder", 1),), frames=site(20, 7))
    r.output(b)
    assert layer_ids(group_passes(r.entries)) == [[0], [1, 2], [3]]


def test_different_parameters_at_one_call_site_are_different_layers():
    r = Records()
    h = r.input()
    for i in range(3):  # for conv in self.convs: x = conv(x)
        h = r.op("conv2d", h, params=conv_params(i), modules=((f"convs.{i}", 1),), frames=site(10, 5))
    r.output(h)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3], [4]]


def test_the_same_parameters_in_operations_of_different_types_are_different_layers():
    r = Records()
    x = r.input()
    a = r.op("linear", x, params=("w",), frames=site(10))
    b = r.op("matmul", a, params=("w",), frames=site(10))  # x @ self.w.T after F.linear(x, self.w)
    r.output(b)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3]]


def test_outputs_at_different_positions_of_a_weighted_call_are_different_layers():
    r = Records()
    x = r.input()
    params = ("lstm.weight_ih_l0", "lstm.weight_hh_l0")
    frames = site(10)
    outs = [r.op("lstm", x, params=params, modules=(("lstm", 1),), frames=frames, output_index=(i,)) for i in range(3)]
    again = [
        r.op("lstm", outs[0], params=params, modules=(("lstm", 2),), frames=frames, output_index=(i,)) for i in range(3)
    ]
    r.output(again[0])
    layers = group_passes(r.entries)
    assert layer_ids(layers) == [[0], [1, 4], [2, 5], [3, 6], [7]]


def test_interleaved_weighted_layers_are_ordered_by_first_pass():
    r = Records()
    h = r.input()
    count = {"a": 0, "b": 0}
    for name in "abaab":
        count[name] += 1
        h = r.op("linear", h, params=(f"{name}.weight",), modules=((name, count[name]),), frames=site(10, 3))
    r.output(h)
    layers = group_passes(r.entries)
    assert layer_ids(layers) == [[0], [1, 3, 4], [2, 5], [6]]
    assign_labels(layers)
    assert [e.label for e in r.entries] == [
        "input_1_0",
        "linear_1_1:1",
        "linear_2_2:1",
        "linear_1_1:2",
        "linear_1_1:3",
        "linear_2_2:2",
        "output_1_3",
    ]


# ----- parameter-free operations: call site and anchor -------------------------------------
def test_relu_after_each_conv_in_a_loop_over_convs_stays_three_layers():
    # for conv in self.convs: x = relu(conv(x))
    r = Records()
    h = r.input()
    relus = []
    for i in range(3):
        h = r.op("conv2d", h, params=conv_params(i), modules=((f"convs.{i}", 1),), frames=site(10, 5))
        h = r.op("relu", h, frames=site(10))
        relus.append(h)
    r.output(h)
    layers = group_passes(r.entries)
    assert layer_ids(layers) == [[0], [1], [2], [3], [4], [5], [6], [7]]
    assign_labels(layers)
    assert [e.label for e in relus] == ["relu_1_2", "relu_2_4", "relu_3_6"]


def test_relu_in_a_loop_reusing_one_linear_is_one_layer():
    # for _ in range(3): x = relu(self.fc(x))
    r = Records()
    h = r.input()
    for n in range(1, 4):
        h = r.op("linear", h, params=FC, modules=(("fc", n),), frames=site(10, 3))
        h = r.op("relu", h, frames=site(10))
    r.output(h)
    assert layer_ids(group_passes(r.entries)) == [[0], [1, 3, 5], [2, 4, 6], [7]]


def test_anchors_pass_through_parameter_free_operations():
    # for conv in self.convs: x = sin(relu(conv(x))): sin's anchor comes through relu
    r = Records()
    h = r.input()
    for i in range(3):
        h = r.op("conv2d", h, params=conv_params(i), modules=((f"convs.{i}", 1),), frames=site(10, 5))
        h = r.op("relu", h, frames=site(10))
        h = r.op("sin", h, frames=site(10, offset=8))
    r.output(h)
    layers = group_passes(r.entries)
    assert len(layers) == 11
    assert all(len(passes) == 1 for passes in layers)


def test_the_anchor_is_the_latest_weighted_ancestor():
    # for i in range(2): u = self.a(x); v = self.convs[i](x); y = u + v (at one line)
    # y's parents are anchored to a (repeating) and convs.i (distinct): convs.i ran later, so
    # the two adds have different anchors and stay two layers
    r = Records()
    x = r.input()
    adds = []
    for i in range(2):
        u = r.op("linear", x, params=("a.weight",), modules=(("a", i + 1),), frames=site(11, 3))
        v = r.op("conv2d", x, params=conv_params(i), modules=((f"convs.{i}", 1),), frames=site(12, 3))
        adds.append(r.op("add", u, v, frames=site(13)))
    r.output(adds[-1])
    layers = group_passes(r.entries)
    assert layer_ids(layers) == [[0], [1, 4], [2], [3], [5], [6], [7]]


def test_an_anchor_shared_by_every_iteration_joins_the_passes():
    # the same loop with the order reversed: v = self.convs[i](x); u = self.a(x); y = u + v.
    # Now a ran last in each iteration, so both adds are anchored to a: one layer, two passes
    r = Records()
    x = r.input()
    adds = []
    for i in range(2):
        v = r.op("conv2d", x, params=conv_params(i), modules=((f"convs.{i}", 1),), frames=site(11, 3))
        u = r.op("linear", x, params=("a.weight",), modules=(("a", i + 1),), frames=site(12, 3))
        adds.append(r.op("add", u, v, frames=site(13)))
    r.output(adds[-1])
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2, 5], [3, 6], [4], [7]]


def test_a_weight_free_loop_is_one_layer_per_call_site():
    # for _ in range(3): x = sin(x); x = x * 2
    r = Records()
    h = r.input()
    for _ in range(3):
        h = r.op("sin", h, frames=site(10))
        h = r.op("mul", h, func_name="__mul__", frames=site(11))
    r.output(h)
    layers = group_passes(r.entries)
    assert layer_ids(layers) == [[0], [1, 3, 5], [2, 4, 6], [7]]
    assign_labels(layers)
    assert [e.label for e in r.entries] == [
        "input_1_0",
        "sin_1_1:1",
        "mul_1_2:1",
        "sin_1_1:2",
        "mul_1_2:2",
        "sin_1_1:3",
        "mul_1_2:3",
        "output_1_3",
    ]


def test_the_same_function_at_other_lines_or_instructions_stays_separate():
    r = Records()
    x = r.input()
    a = r.op("relu", x, frames=site(10))
    b = r.op("relu", a, frames=site(11))  # another line
    c = r.op("relu", b, frames=site(11, offset=6))  # the same line, another instruction: relu(relu(x))
    d = r.op("relu", c, frames=site(9, 11))  # reached through another caller line
    r.output(d)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3], [4], [5]]


def test_the_same_call_stack_in_other_modules_stays_separate():
    # two look-alike parameter-free modules: act1 and act2 run the same code
    r = Records()
    x = r.input()
    a = r.op("gelu", x, modules=(("act1", 1),), frames=site(10, 3))
    b = r.op("gelu", a, modules=(("act2", 1),), frames=site(10, 3))
    r.output(b)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3]]


def test_a_parameter_free_module_called_in_a_loop_is_one_layer():
    # the module's pass number is not part of the call site, its address is
    r = Records()
    h = r.input()
    for n in range(1, 3):
        h = r.op("gelu", h, modules=(("act", n),), frames=site(10, 3))
    r.output(h)
    assert layer_ids(group_passes(r.entries)) == [[0], [1, 2], [3]]


def test_different_function_names_at_one_site_are_different_layers():
    r = Records()
    x = r.input()
    frames = site(10)
    a = r.op("add", x, func_name="__add__", frames=frames)
    b = r.op("add", a, func_name="__iadd__", frames=frames)
    r.output(b)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3]]


def test_the_first_iteration_without_an_anchor_joins_the_loop():
    # for _ in range(3): x = self.fc(sin(x)): the first sin has no weighted ancestor
    r = Records()
    h = r.input()
    for n in range(1, 4):
        h = r.op("sin", h, frames=site(10))
        h = r.op("linear", h, params=FC, modules=(("fc", n),), frames=site(10, 3))
    r.output(h)
    assert layer_ids(group_passes(r.entries)) == [[0], [1, 3, 5], [2, 4, 6], [7]]


def test_a_first_iteration_anchored_before_the_loop_joins_a_repeating_group():
    # x = self.pre(x); for _ in range(3): x = self.fc(sin(x))
    r = Records()
    h = r.input()
    h = r.op("linear", h, params=("pre.weight",), modules=(("pre", 1),), frames=site(9, 3))
    for n in range(1, 4):
        h = r.op("sin", h, frames=site(10))
        h = r.op("linear", h, params=FC, modules=(("fc", n),), frames=site(10, 3))
    r.output(h)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2, 4, 6], [3, 5, 7], [8]]


def test_an_unanchored_occurrence_beside_several_anchors_is_its_own_layer():
    # the call site is reached once with no weighted ancestor, then after two different convs
    r = Records()
    x = r.input()
    first = r.op("relu", x, frames=site(10))
    c0 = r.op("conv2d", first, params=conv_params(0), modules=(("convs.0", 1),), frames=site(11, 5))
    second = r.op("relu", c0, frames=site(10))
    c1 = r.op("conv2d", second, params=conv_params(1), modules=(("convs.1", 1),), frames=site(11, 5))
    third = r.op("relu", c1, frames=site(10))
    r.output(third)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3], [4], [5], [6]]


def test_calls_inside_a_weighted_block_are_counted_from_its_forward():
    # x = self.block(x); x = self.block(x), two lines of the model's forward; block.forward
    # is relu(self.fc(x)). module_frame_depths says how many frames lie above block.forward
    r = Records()
    h = r.input()
    for n, line in ((1, 20), (2, 21)):
        stack = (("block", n), ("block.fc", n))
        h = r.op("linear", h, params=("block.fc.weight",), modules=stack, frames=site(line, 6, 3))
        h = r.op("relu", h, modules=(("block", n),), frames=site(line, 6))
    r.output(h)
    depths = {("block", 1): 1, ("block", 2): 1}
    assert layer_ids(group_passes(r.entries, depths)) == [[0], [1, 3], [2, 4], [5]]
    # without the depths the relus are counted from the model's forward: two call sites
    assert layer_ids(group_passes(r.entries)) == [[0], [1, 3], [2], [4], [5]]


def test_the_innermost_weighted_module_sets_where_the_call_site_starts():
    # outer.forward calls self.inner twice from two lines; inner.forward is relu(self.fc(x))
    r = Records()
    h = r.input()
    for n, line in ((1, 30), (2, 31)):
        stack = (("outer", 1), ("outer.inner", n))
        h = r.op(
            "linear",
            h,
            params=("outer.inner.fc.weight",),
            modules=stack + (("outer.inner.fc", n),),
            frames=site(5, line, 6, 3),
        )
        h = r.op("relu", h, modules=stack, frames=site(5, line, 6))
    r.output(h)
    depths = {("outer", 1): 1, ("outer.inner", 1): 2, ("outer.inner", 2): 2}
    assert layer_ids(group_passes(r.entries, depths)) == [[0], [1, 3], [2, 4], [5]]
    only_outer = {("outer", 1): 1}
    assert layer_ids(group_passes(r.entries, only_outer)) == [[0], [1, 3], [2], [4], [5]]


# ----- sources and sinks -------------------------------------------------------------------
def test_inputs_outputs_and_buffers_are_layers_of_their_own():
    r = Records()
    x = r.input("x")
    y = r.input("y")
    b = r.buffer("scale")
    s = r.op("add", x, y, frames=site(10))
    t = r.op("mul", s, b, frames=site(11))
    r.output(s, "output.0")
    r.output(t, "output.1")
    layers = group_passes(r.entries)
    assert layer_ids(layers) == [[0], [1], [2], [3], [4], [5], [6]]
    assign_labels(layers)
    assert [e.label for e in r.entries] == [
        "input_1_0",
        "input_2_1",
        "buffer_1_2",
        "add_1_3",
        "mul_1_4",
        "output_1_5",
        "output_2_6",
    ]


def test_the_readme_recurrent_example():
    # for r in range(4): x = self.fc(x); x = x + 1; x = x * 2
    r = Records()
    h = r.input()
    for n in range(1, 5):
        h = r.op("linear", h, params=FC, modules=(("fc", n),), frames=site(10, 3))
        h = r.op("add", h, func_name="__add__", frames=site(11))
        h = r.op("mul", h, func_name="__mul__", frames=site(12))
    r.output(h)
    layers = group_passes(r.entries)
    assign_labels(layers)
    labels = [e.label for e in r.entries]
    assert labels[:5] == ["input_1_0", "linear_1_1:1", "add_1_2:1", "mul_1_3:1", "linear_1_1:2"]
    assert labels[-2:] == ["mul_1_3:4", "output_1_4"]
    assert len(layers) == 5


# ----- where the allowances misjudge: current behaviour, documented ----------------------
def test_known_imprecision_a_two_iteration_loop_after_a_weighted_op_splits():
    # x = self.pre(x); for _ in range(2): x = self.fc(sin(x)). The first sin is anchored to
    # pre, the second to fc; the allowance for a first iteration needs the other group to
    # repeat, so a two-iteration loop gives two sin layers while fc has two passes.
    r = Records()
    h = r.input()
    h = r.op("linear", h, params=("pre.weight",), modules=(("pre", 1),), frames=site(9, 3))
    for n in range(1, 3):
        h = r.op("sin", h, frames=site(10))
        h = r.op("linear", h, params=FC, modules=(("fc", n),), frames=site(10, 3))
    r.output(h)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3, 5], [4], [6]]


def test_known_imprecision_a_loop_over_layers_ending_in_a_repeat_merges():
    # for conv in [c0, c1, c1]: x = relu(conv(x)). The first relu follows a different layer,
    # but the allowance for a first iteration joins it to the repeating group after c1.
    r = Records()
    h = r.input()
    for i, n in ((0, 1), (1, 1), (1, 2)):
        h = r.op("conv2d", h, params=conv_params(i), modules=((f"convs.{i}", n),), frames=site(10, 5))
        h = r.op("relu", h, frames=site(10))
    r.output(h)
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2, 4, 6], [3, 5], [7]]


def test_known_imprecision_parallel_branches_in_a_comprehension_are_passes():
    # torch.stack([torch.relu(b) for b in (x, y, z)]): one call site, no weighted ancestor,
    # so three parallel relus become one layer with three passes (not a loop over one tensor)
    r = Records()
    xs = [r.input(name) for name in "xyz"]
    relus = [r.op("relu", x, frames=site(10, 2)) for x in xs]
    r.output(r.op("stack", *relus, frames=site(10)))
    assert layer_ids(group_passes(r.entries)) == [[0], [1], [2], [3, 4, 5], [6], [7]]
