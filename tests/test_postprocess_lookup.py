"""history/index.py ``build_lookup`` on hand-built, labelled records: every key form of
every entry, ``Ambiguous`` for keys naming several, ``lookup_keys`` and the suggestions."""

from postprocess_records import Records

from torchlens.trace.history.index import Ambiguous, build_lookup
from torchlens.trace.postprocess.labels import assign_labels


def _named(lookup):
    """key -> label, or ('ambiguous', what, labels, suggestions)."""
    return {
        k: (v.label if not isinstance(v, Ambiguous) else ("ambiguous", v.what, v.labels, v.suggestions))
        for k, v in lookup.items()
    }


def _module_output(e, address, pass_num, position=()):
    """What build_history records for a tensor that module call ``address:pass_num`` returned."""
    e.output_of_modules.append((address, pass_num))
    e.module_output_positions = e.module_output_positions or {}
    e.module_output_positions.setdefault((address, pass_num), position)


def _one_linear():
    r = Records()
    x = r.input()
    lin = r.op("linear", x, params=("fc.weight",), modules=(("fc", 1),))
    _module_output(lin, "fc", 1)
    out = r.output(lin)
    assign_labels([[x], [lin], [out]])
    return r.entries


def _linear_twice():
    r = Records()
    x = r.input()
    l1 = r.op("linear", x, params=("fc.weight",), modules=(("fc", 1),))
    _module_output(l1, "fc", 1)
    l2 = r.op("linear", l1, params=("fc.weight",), modules=(("fc", 2),))
    _module_output(l2, "fc", 2)
    out = r.output(l2)
    assign_labels([[x], [l1, l2], [out]])
    return r.entries


# ----- single-pass layers ------------------------------------------------------------------
def test_every_key_of_a_single_pass_history():
    entries = _one_linear()
    assert _named(build_lookup(entries, {"fc": 1})) == {
        0: "input_1_0",
        -3: "input_1_0",
        "input_1_0": "input_1_0",
        "input_1_0:1": "input_1_0",
        "input_1:1": "input_1_0",
        "input_1": "input_1_0",
        "input.x": "input_1_0",
        1: "linear_1_1",
        -2: "linear_1_1",
        "linear_1_1": "linear_1_1",
        "linear_1_1:1": "linear_1_1",
        "linear_1:1": "linear_1_1",
        "linear_1": "linear_1_1",
        "fc": "linear_1_1",
        "fc:1": "linear_1_1",
        2: "output_1_2",
        -1: "output_1_2",
        "output_1_2": "output_1_2",
        "output_1_2:1": "output_1_2",
        "output_1:1": "output_1_2",
        "output_1": "output_1_2",
        "output": "output_1_2",
    }


def test_lookup_keys_list_ordinals_then_strings_that_name_the_entry():
    entries = _one_linear()
    build_lookup(entries, {"fc": 1})
    assert [e.lookup_keys for e in entries] == [
        [-3, 0, "input.x", "input_1_0", "input_1_0:1"],
        [-2, 1, "fc", "fc:1", "linear_1_1", "linear_1_1:1"],
        [-1, 2, "output", "output_1_2", "output_1_2:1"],
    ]


def test_ordinals_index_the_entries_from_both_ends():
    r = Records()
    h = r.input()
    for _ in range(4):
        h = r.op("sin", h)
    r.output(h)
    assign_labels([[e] for e in r.entries])
    lookup = build_lookup(r.entries, {})
    n = len(r.entries)
    assert all(lookup[i] is e and lookup[i - n] is e for i, e in enumerate(r.entries))
    assert n not in lookup and -n - 1 not in lookup


def test_every_entry_shares_the_module_passes_dict():
    entries = _one_linear()
    passes = {"fc": 1}
    build_lookup(entries, passes)
    assert all(e.module_passes is passes for e in entries)


def test_input_output_and_buffer_addresses():
    r = Records()
    x = r.input("x")
    y = r.input("y")
    b = r.buffer("bn.running_mean", modules=(("bn", 1),))
    s = r.op("add", x, y, b)
    r.output(s, "output.0")
    r.output(x, "output.1")
    assign_labels([[e] for e in r.entries])
    named = _named(build_lookup(r.entries, {"bn": 1}))
    assert {k: named[k] for k in ("input.x", "input.y", "bn.running_mean", "output.0", "output.1")} == {
        "input.x": "input_1_0",
        "input.y": "input_2_1",
        "bn.running_mean": "buffer_1_2",
        "output.0": "output_1_4",
        "output.1": "output_2_5",
    }
    assert "bn" not in named  # a module is found by the tensors it returned, not the ones inside it


# ----- layers with several passes ----------------------------------------------------------
def test_every_key_of_a_layer_with_two_passes():
    entries = _linear_twice()
    named = _named(build_lookup(entries, {"fc": 2}))
    layer = (
        "ambiguous",
        "layer linear_1_1 has 2 passes",
        ["linear_1_1:1", "linear_1_1:2"],
        ["linear_1_1:1", "linear_1_1:2"],
    )
    assert {k: v for k, v in named.items() if "linear" in str(k) or "fc" in str(k)} == {
        "linear_1_1:1": "linear_1_1:1",
        "linear_1_1:2": "linear_1_1:2",
        "linear_1:1": "linear_1_1:1",
        "linear_1:2": "linear_1_1:2",
        "fc:1": "linear_1_1:1",
        "fc:2": "linear_1_1:2",
        "linear_1_1": layer,
        "linear_1": layer,
        "fc": ("ambiguous", "module fc has 2 passes", ["linear_1_1:1", "linear_1_1:2"], ["fc:1", "fc:2"]),
    }
    assert [named[i] for i in (1, 2, -3, -2)] == ["linear_1_1:1", "linear_1_1:2"] * 2


def test_lookup_keys_of_a_pass_leave_out_the_ambiguous_keys():
    entries = _linear_twice()
    build_lookup(entries, {"fc": 2})
    assert [e.lookup_keys for e in entries[1:3]] == [[-3, 1, "fc:1", "linear_1_1:1"], [-2, 2, "fc:2", "linear_1_1:2"]]


# ----- module calls returning several tensors ----------------------------------------------
def _lstm_call():
    # output, (h, c) = self.lstm(x)
    r = Records()
    x = r.input()
    outs = [r.op("lstm", x, params=("lstm.w",), modules=(("lstm", 1),), output_index=(i,)) for i in range(3)]
    for e, position in zip(outs, [(0,), (1, 0), (1, 1)]):
        _module_output(e, "lstm", 1, position)
    assign_labels([[e] for e in r.entries])
    return r.entries, outs


def test_one_module_call_returning_several_tensors():
    entries, outs = _lstm_call()
    named = _named(build_lookup(entries, {"lstm": 1}))
    labels = ["lstm_1_1", "lstm_2_2", "lstm_3_3"]
    suggestions = ["lstm:1.0", "lstm:1.1.0", "lstm:1.1.1"]
    assert {k: v for k, v in named.items() if str(k).startswith("lstm:") or k == "lstm"} == {
        "lstm:1.0": "lstm_1_1",
        "lstm:1.1.0": "lstm_2_2",
        "lstm:1.1.1": "lstm_3_3",
        "lstm:1": ("ambiguous", "module call lstm:1 returned several tensors", labels, suggestions),
        "lstm": ("ambiguous", "module lstm returned several tensors", labels, suggestions),
    }
    assert outs[1].lookup_keys == [-2, 2, "lstm:1.1.0", "lstm_2_2", "lstm_2_2:1"]


def test_a_module_with_several_passes_and_several_outputs():
    r = Records()
    h = r.input()
    outs = []
    for n in (1, 2):
        pair = [r.op("chunk", h, modules=(("split", n),), output_index=i) for i in range(2)]
        for i, e in enumerate(pair):
            _module_output(e, "split", n, i)
        outs += pair
        h = pair[0]
    assign_labels([[r.entries[0]], [outs[0], outs[2]], [outs[1], outs[3]]])
    named = _named(build_lookup(r.entries, {"split": 2}))
    assert [e.label for e in outs] == ["chunk_1_1:1", "chunk_2_2:1", "chunk_1_1:2", "chunk_2_2:2"]
    assert named["split"] == (
        "ambiguous",
        "module split has 2 passes",
        ["chunk_1_1:1", "chunk_2_2:1", "chunk_1_1:2", "chunk_2_2:2"],
        ["split:1.0", "split:1.1", "split:2.0", "split:2.1"],
    )
    assert named["split:2"] == (
        "ambiguous",
        "module call split:2 returned several tensors",
        ["chunk_1_1:2", "chunk_2_2:2"],
        ["split:2.0", "split:2.1"],
    )
    assert [named[f"split:{n}.{i}"] for n in (1, 2) for i in (0, 1)] == [e.label for e in outs]


def test_a_module_returning_one_tensor_twice_names_it():
    # return y, y
    r = Records()
    x = r.input()
    y = r.op("sin", x, modules=(("pair", 1),))
    _module_output(y, "pair", 1, 0)
    _module_output(y, "pair", 1, 1)  # the first position is kept
    assign_labels([[x], [y]])
    lookup = build_lookup(r.entries, {"pair": 1})
    assert (lookup["pair"], lookup["pair:1"], lookup["pair:1.0"]) == (y, y, y)
    assert "pair:1.1" not in lookup
    assert y.lookup_keys == [-1, 1, "pair", "pair:1", "pair:1.0", "sin_1_1", "sin_1_1:1"]


def test_nested_modules_that_return_the_same_tensor():
    r = Records()
    x = r.input()
    y = r.op("linear", x, params=("block.fc.weight",), modules=(("block", 1), ("block.fc", 1)))
    _module_output(y, "block.fc", 1)
    _module_output(y, "block", 1)
    assign_labels([[x], [y]])
    lookup = build_lookup(r.entries, {"block": 1, "block.fc": 1})
    assert [lookup[k] is y for k in ("block", "block:1", "block.fc", "block.fc:1")] == [True] * 4
    assert y.lookup_keys == [-1, 1, "block", "block.fc", "block.fc:1", "block:1", "linear_1_1", "linear_1_1:1"]


def test_without_module_output_positions_the_label_is_the_suggestion():
    # the fallback of _specific_key: no recorded position for the module call
    r = Records()
    x = r.input()
    a = r.op("sin", x, modules=(("m", 1),))
    b = r.op("cos", x, modules=(("m", 1),))
    a.output_of_modules.append(("m", 1))
    b.output_of_modules.append(("m", 1))
    assign_labels([[x], [a], [b]])
    found = build_lookup(r.entries, {"m": 1})["m"]
    assert isinstance(found, Ambiguous)
    assert (found.labels, found.suggestions) == (["sin_1_1", "cos_1_2"], ["sin_1_1", "cos_1_2"])


def test_a_key_of_one_entry_wins_over_a_module_address_that_spells_it():
    # self.output = nn.Linear(...): the module's address is also the model output's address
    r = Records()
    x = r.input()
    lin = r.op("linear", x, params=("output.weight",), modules=(("output", 1),))
    _module_output(lin, "output", 1)
    out = r.output(lin)
    assign_labels([[x], [lin], [out]])
    lookup = build_lookup(r.entries, {"output": 1})
    assert lookup["output"] is out
    assert lookup["output:1"] is lin
    assert lin.lookup_keys == [-2, 1, "linear_1_1", "linear_1_1:1", "output:1"]


def test_a_dropped_history_is_freed_at_once_not_by_the_cyclic_collector():
    """An ambiguous key's lazy suggestions refer to the index weakly: a history with recurrent
    passes is no reference cycle, so dropping it frees it (and its activations) right away
    instead of at the collector's next slow full pass."""
    import gc

    import torch

    import torchlens as tl

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    model, x = Twice(), torch.ones(1, 3)
    tl.log_forward_pass(model, x)
    gc.collect()
    history = tl.log_forward_pass(model, x)
    ambiguous = history._lookup["fc"]
    assert isinstance(ambiguous, Ambiguous) and ambiguous.suggestions == ["fc:1", "fc:2"]  # found in the index
    other = tl.log_forward_pass(model, x)._lookup["fc"]
    del history
    assert gc.collect() == 0
    assert other.suggestions == ["linear_1_1:1", "linear_1_1:2"]  # its history is gone: the labels


def _two_block_history():
    import torch

    import torchlens as tl

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)
            self.out = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.out(torch.relu(self.fc(torch.relu(self.fc(x)))))

    model, x = Net(), torch.ones(1, 3)
    return lambda: tl.log_forward_pass(model, x)


def test_lookup_keys_read_before_any_lookup_are_those_of_the_built_index():
    """The index is built on first use: an entry's keys read first build it for all entries,
    and they are what building it eagerly gives."""
    trace = _two_block_history()
    history = trace()
    assert history._index is None  # a pass whose layers nobody looks up never builds it
    keys = [list(e.lookup_keys) for e in history]
    assert history._index is not None
    expected = [list(e.lookup_keys) for e in trace()]
    eager = trace()
    build_lookup(eager.layer_list, eager.modules.passes)
    assert keys == expected == [e.lookup_keys for e in eager]
    assert all(history[k] is e for e in history for k in e.lookup_keys)


def test_entries_that_outlive_their_history_keep_their_keys():
    """A history dropped before its index was built gives the entries still held elsewhere
    (a loop variable, a slice, its list) their keys as it goes; one nothing holds builds none."""
    import gc
    import weakref

    trace = _two_block_history()
    expected = [list(e.lookup_keys) for e in trace()]
    assert [e.lookup_keys for e in trace()] == expected  # a loop over a history nothing holds
    assert [e.lookup_keys for e in list(trace())] == expected  # a list of its entries
    assert [e.lookup_keys for e in trace()[1:3]] == expected[1:3]  # a slice
    assert [e.lookup_keys for e in trace().layer_list] == expected  # its own list
    kept = list(trace())[2]
    assert "Lookup keys: " + ", ".join(map(str, expected[2])) in str(kept)
    gc.collect()
    history = trace()
    entry = weakref.ref(history.layer_list[0])
    del history
    assert gc.collect() == 0 and entry() is None  # no cycle: gone with its history
