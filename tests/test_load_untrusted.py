"""A saved history is untrusted input: loading it, validating it and re-running it never calls a
function the file chose, never reads a file outside its folder, and every malformed field is a
``HistoryFileError`` naming the layer."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.rerun import RerunError
from torchlens.trace.storage.codec import UnavailableFunction
from torchlens.trace.validate import validate_history


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return torch.sigmoid(torch.relu(self.fc(x)) * 2)


@pytest.fixture
def saved(tmp_path) -> pathlib.Path:
    torch.manual_seed(0)
    h = tl.log_forward_pass(Small(), torch.rand(2, 3), save_function_args=True)
    return pathlib.Path(h.save(tmp_path / "h"))


def _index(folder: pathlib.Path) -> dict:
    return json.loads((folder / "torchlens.json").read_text())


def _write(folder: pathlib.Path, document: dict) -> None:
    (folder / "torchlens.json").write_text(json.dumps(document))


def _set_field(document: dict, label: str, field: str, value) -> None:
    fields = document["entry_fields"]
    for row in document["entries"]:
        if row[fields.index("label")] == label:
            row[fields.index(field)] = value
            return
    raise AssertionError(f"no entry {label}")


def _tamper(folder: pathlib.Path, func: str, args: list, label: str = "relu_1_2") -> None:
    document = _index(folder)
    _set_field(document, label, "func", {"t": "func", "v": func})
    _set_field(document, label, "func_args", {"t": "tuple", "v": args})
    _set_field(document, label, "func_kwargs", {"t": "dict", "v": []})
    _write(folder, document)


def _validate_then_rerun(folder: pathlib.Path) -> None:
    """What a user does with a history they were sent (whatever happens, nothing may run)."""
    loaded = tl.load(folder)
    validate_history(loaded)
    try:
        loaded.rerun({"linear_1_1": torch.zeros(2, 3)})
    except RerunError:
        pass


def _replays_refused(folder: pathlib.Path, name: str, label: str = "relu_1_2") -> None:
    """Validation and rerun report the layer's function as not re-runnable and call nothing."""
    loaded = tl.load(folder)
    func = loaded[label].func
    assert isinstance(func, UnavailableFunction), f"{name} was resolved to {func!r}"
    assert name in repr(func)
    assert validate_history(loaded) is False
    with pytest.raises(RerunError, match=rf"{label} is downstream of the change, but the saved function {name}"):
        loaded.rerun({"linear_1_1": torch.zeros(2, 3)})


# ----- functions the file chooses ------------------------------------------------------------
def test_eval_in_a_saved_history_is_never_called(saved, tmp_path):
    marker = tmp_path / "pwned"
    _tamper(saved, "builtins.eval", [f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"])
    _validate_then_rerun(saved)
    assert not marker.exists()
    _replays_refused(saved, "builtins.eval")


def test_exec_in_a_saved_history_is_never_called(saved, tmp_path):
    marker = tmp_path / "pwned"
    _tamper(saved, "builtins.exec", [f"open({str(marker)!r}, 'w').write('x')"])
    _validate_then_rerun(saved)
    assert not marker.exists()
    _replays_refused(saved, "builtins.exec")


def test_open_in_a_saved_history_is_never_called(saved, tmp_path):
    marker = tmp_path / "created"
    _tamper(saved, "builtins.open", [str(marker), "w"])
    _validate_then_rerun(saved)
    assert not marker.exists()
    _replays_refused(saved, "builtins.open")


def test_a_module_reached_through_torchlens_is_not_entered(saved, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    _tamper(saved, "torchlens.trace.storage.save.shutil.rmtree", [str(victim)])
    _validate_then_rerun(saved)
    assert victim.exists()
    _replays_refused(saved, "torchlens.trace.storage.save.shutil.rmtree")


@pytest.mark.parametrize(
    "name",
    [
        "operator.attrgetter",
        "torch.load",
        "torch.save",
        "torch.from_file",
        "torch.ops.aten.from_file.default",
        "torch.ops.aten.save.default",
        "torch.ops.load_library",
        "torch.os.system",
        "torchlens.trace.storage.save.save_history",
        "torchlens.trace.capture.run.run_pass",
    ],
)
def test_functions_torchlens_does_not_trace_are_not_replayed(saved, name):
    _tamper(saved, name, [{"t": "parent", "v": "linear_1_1"}])
    _replays_refused(saved, name)


def test_a_refused_function_among_the_arguments_is_not_called(saved, monkeypatch):
    # Tensor.apply_ is traced, and calls the function it is given on every element
    import builtins

    calls = []
    monkeypatch.setattr(builtins, "print", lambda *a: calls.append(a) or 0.0)
    _tamper(saved, "torch.Tensor.apply_", [{"t": "parent", "v": "linear_1_1"}, {"t": "func", "v": "builtins.print"}])
    loaded = tl.load(saved)
    assert isinstance(loaded["relu_1_2"].func_args[1], UnavailableFunction)
    assert validate_history(loaded) is False
    assert calls == []


def test_real_operations_of_a_loaded_history_still_replay(saved):
    loaded = tl.load(saved)
    assert validate_history(loaded) is True
    changed = loaded.rerun({"linear_1_1": torch.zeros(2, 3)})
    assert torch.equal(changed["sigmoid_1_4"].activation, torch.full((2, 3), 0.5))


def test_torch_ops_and_pass_through_functions_load_as_themselves(saved):
    document = _index(saved)
    _set_field(document, "relu_1_2", "func", {"t": "func", "v": "torch.ops.aten.relu.default"})
    _write(saved, document)
    loaded = tl.load(saved)
    assert loaded["relu_1_2"].func is torch.ops.aten.relu.default
    assert loaded["output_1_5"].func.__name__ == "identity"
    assert validate_history(loaded) is True


def test_live_histories_keep_their_function_objects():
    def mine(x):
        return x * 3

    h = tl.log_forward_pass(Small(), torch.rand(2, 3), save_function_args=True)
    h["relu_1_2"].func = mine  # anything a user puts in a live history is theirs to call
    changed = h.rerun({"linear_1_1": torch.ones(2, 3)})
    assert torch.equal(changed["mul_1_3"].activation, torch.full((2, 3), 6.0))


def test_loading_resolves_no_attribute_of_arbitrary_objects(saved):
    # a name is followed through modules and classes only, never into a function's globals
    _tamper(saved, "torch.cuda.is_available.__globals__", [])
    loaded = tl.load(saved)
    assert isinstance(loaded["relu_1_2"].func, UnavailableFunction)


def test_record_types_are_torchlens_dataclasses_under_their_own_name(saved):
    document = _index(saved)
    modules = document["history"]["modules"]
    modules["cls"] = "torchlens.trace.storage.codec.dataclasses.dataclass"
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match="unknown record type"):
        tl.load(saved)


def test_saved_functions_are_checked_when_loading(saved, monkeypatch):
    """The allowlist is consulted at load time, so a history never holds an unchecked callable."""
    from torchlens.trace.storage import allowlist

    checked = []
    real = allowlist._check
    monkeypatch.setattr(allowlist, "_CACHE", {})
    monkeypatch.setattr(allowlist, "_check", lambda name: checked.append(name) or real(name))
    tl.load(saved)
    assert "torch.relu" in checked and "torch.sigmoid" in checked


# ----- files outside the folder --------------------------------------------------------------
def _other_history(tmp_path: pathlib.Path) -> pathlib.Path:
    """A second saved history (its shard stands for any file the attacker would like read)."""
    h = tl.log_forward_pass(nn.Sequential(nn.Linear(3, 3)), torch.full((2, 3), 7.0))
    return pathlib.Path(h.save(tmp_path / "other"))


def _point_activation_at(folder: pathlib.Path, file: str, size: int) -> None:
    """Make the input layer's activation (tensor #0, 't0') a tensor of file ``file``."""
    document = _index(folder)
    document["files"][file] = size
    document["tensors"][0]["file"] = file
    _write(folder, document)


def _read_everything(folder: pathlib.Path) -> None:
    loaded = tl.load(folder)
    for entry in loaded:
        entry.activation, entry.func_args, entry.func_kwargs


def test_a_tensor_file_outside_the_folder_is_not_read(saved, tmp_path):
    other = _other_history(tmp_path) / "tensors-00000.safetensors"
    _point_activation_at(saved, "../other/tensors-00000.safetensors", other.stat().st_size)
    with pytest.raises(tl.HistoryFileError, match=r"'\.\./other/tensors-00000\.safetensors' leads outside the saved"):
        _read_everything(saved)


def test_an_absolute_tensor_file_is_not_read(saved, tmp_path):
    other = _other_history(tmp_path) / "tensors-00000.safetensors"
    _point_activation_at(saved, str(other), other.stat().st_size)
    with pytest.raises(tl.HistoryFileError, match="leads outside the saved folder"):
        _read_everything(saved)


def test_a_symlink_inside_the_folder_pointing_out_is_not_followed(saved, tmp_path):
    other = _other_history(tmp_path) / "tensors-00000.safetensors"
    (saved / "tensors-00001.safetensors").symlink_to(other)
    _point_activation_at(saved, "tensors-00001.safetensors", other.stat().st_size)
    with pytest.raises(
        tl.HistoryFileError, match="tensors-00001.safetensors: a link to a file outside the saved folder"
    ):
        _read_everything(saved)


def test_an_index_linked_from_elsewhere_is_not_read(saved, tmp_path):
    other = _other_history(tmp_path)
    (saved / "torchlens.json").unlink()
    (saved / "torchlens.json").symlink_to(other / "torchlens.json")
    with pytest.raises(tl.HistoryFileError, match="torchlens.json: a link to a file outside the saved folder"):
        tl.load(saved)


def test_a_symlink_that_stays_inside_the_folder_is_fine(saved):
    (saved / "tensors-00000.safetensors").rename(saved / "data.safetensors")
    (saved / "tensors-00000.safetensors").symlink_to("data.safetensors")
    loaded = tl.load(saved)
    assert loaded["linear_1_1"].activation.shape == (2, 3)


# ----- malformed tensor metadata -------------------------------------------------------------
def _record_of(document: dict, label: str, field: str = "activation") -> dict:
    fields = document["entry_fields"]
    row = next(r for r in document["entries"] if r[fields.index("label")] == label)
    return document["tensors"][row[fields.index(field)]["k"]]


@pytest.mark.parametrize("shape", [[3, 3], [1], [2, 3, 1, 0, 5]])
def test_a_shape_that_does_not_fit_the_stored_bytes_names_the_layer(saved, shape):
    document = _index(saved)
    _record_of(document, "relu_1_2")["shape"] = shape
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match=r"relu_1_2.*holds 24 bytes but the index describes"):
        tl.load(saved)["relu_1_2"].activation


def test_a_shape_larger_than_the_file_is_refused_before_anything_is_allocated(saved):
    import tracemalloc

    document = _index(saved)
    _record_of(document, "relu_1_2")["shape"] = [1 << 20, 1 << 20]
    _write(saved, document)
    size = sum(p.stat().st_size for p in saved.iterdir())
    tracemalloc.start()
    try:
        with pytest.raises(tl.HistoryFileError, match=r"layer relu_1_2: the activation: .*more than its file"):
            tl.load(saved)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * size


@pytest.mark.parametrize(
    "key,value",
    [
        ("dtype", "evil"),
        ("dtype", "Tensor"),
        ("crc", "x"),
        ("shape", [-1, 6]),
        ("shape", "6"),
        ("name", 5),
        ("kind", "x"),
    ],
)
def test_malformed_tensor_records_name_the_layer(saved, key, value):
    document = _index(saved)
    _record_of(document, "relu_1_2")[key] = value
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match=r"layer relu_1_2: the activation"):
        tl.load(saved)["relu_1_2"].activation


def test_a_parameter_flag_on_an_integer_tensor_is_a_file_error(saved):
    document = _index(saved)
    next(r for r in document["tensors"] if r.get("parameter"))["dtype"] = "int32"  # same bytes, cannot require grad
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match="cannot be a parameter"):
        _read_everything(saved)


# ----- malformed fields ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value,problem",
    [
        ("pass_num", "x", "malformed 'pass_num'"),
        ("kind", "evil", "malformed 'kind'"),
        ("parent_layers", ["nowhere_9_9"], "refers to nowhere_9_9, which is not a layer"),
        ("module_stack", {"t": "tuple", "v": [{"t": "tuple", "v": ["ghost", 1]}]}, "refers to module 'ghost'"),
        ("shape", {"t": "device", "v": "not a device"}, "malformed 'device' value"),
        ("call_frames", [[99, 1, 1]], "malformed 'call_frames'"),
        ("activation", {"t": "tensor", "k": 10**6}, "refers to tensor #1000000"),
        ("gradient", "", "malformed 'gradient'"),
        ("func_kwargs", [], "malformed 'func_kwargs'"),
    ],
)
def test_malformed_fields_name_the_layer(saved, field, value, problem):
    document = _index(saved)
    _set_field(document, "relu_1_2", field, value)
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match=rf"layer relu_1_2: .*{problem}"):
        tl.load(saved)


def test_an_unknown_field_name_is_a_file_error(saved):
    document = _index(saved)
    document["entry_fields"][document["entry_fields"].index("intervened")] = "__weakref__"
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match="fields this torchlens does not know"):
        tl.load(saved)


def test_deeply_nested_json_is_a_file_error(saved):
    text = (saved / "torchlens.json").read_text()
    (saved / "torchlens.json").write_text(text.replace('"notes":[]', '"notes":' + "[" * 100000 + "]" * 100000))
    with pytest.raises(tl.HistoryFileError, match="torchlens.json"):
        tl.load(saved)


def test_history_attributes_cannot_replace_methods(saved):
    document = _index(saved)
    document["history"]["rerun"] = 1
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match="history: unexpected attribute 'rerun'"):
        tl.load(saved)


def _guards_entered(monkeypatch) -> list:
    from torchlens.trace import replay_guard

    entered = []
    enter = replay_guard.ReplayGuard.__enter__
    monkeypatch.setattr(replay_guard.ReplayGuard, "__enter__", lambda self: entered.append(self) or enter(self))
    return entered


def test_a_loaded_history_is_replayed_under_the_guard_and_a_traced_one_without(saved, monkeypatch):
    entered = _guards_entered(monkeypatch)
    loaded = tl.load(saved)
    assert not loaded.traced_here
    assert validate_history(loaded) is True
    loaded.rerun({"linear_1_1": torch.zeros(2, 3)}).rerun({"linear_1_1": torch.ones(2, 3)})  # a copy stays guarded
    guarded = len(entered)
    assert guarded >= 3 + 2 + 2  # every replayed operation of the three calls
    torch.manual_seed(0)
    fresh = tl.log_forward_pass(Small(), torch.rand(2, 3), save_function_args=True)
    assert fresh.traced_here
    assert validate_history(fresh) is True
    changed = fresh.rerun({"linear_1_1": torch.zeros(2, 3)})
    assert torch.equal(changed["sigmoid_1_4"].activation, torch.full((2, 3), 0.5))
    assert tl.validate_model_activations(Small(), torch.rand(2, 3)) is True
    assert len(entered) == guarded  # the model's own calls ran as in its forward pass


def test_a_file_cannot_claim_its_history_was_traced_here(saved):
    document = _index(saved)
    assert "traced_here" not in document["history"]  # never written
    document["history"]["traced_here"] = True
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match="history: unexpected attribute 'traced_here'"):
        tl.load(saved)


# ----- memory: an edited index cannot multiply the folder's data ------------------------------
def test_records_naming_the_same_stored_tensor_share_its_memory(saved):
    document = _index(saved)
    source = _record_of(document, "linear_1_1")
    for label in ("relu_1_2", "mul_1_3", "sigmoid_1_4"):
        record = _record_of(document, label)
        record.update({k: source[k] for k in ("file", "name", "crc", "shape", "dtype")})
    _write(saved, document)
    loaded = tl.load(saved)
    pointers = {
        loaded[label].activation.untyped_storage().data_ptr() for label in ("linear_1_1", "relu_1_2", "mul_1_3")
    }
    assert len(pointers) == 1


def test_a_nested_tensor_repeating_one_part_cannot_outgrow_the_folder(saved):
    document = _index(saved)
    record = _record_of(document, "relu_1_2")
    part = {k: record[k] for k in ("file", "name", "dtype", "shape", "crc")}
    record.clear()
    record.update({"kind": "nested", "parts": [part] * (sum(document["files"].values()) // 24 + 1)})
    _write(saved, document)
    with pytest.raises(tl.HistoryFileError, match="builds more tensor data than its files hold"):
        tl.load(saved)["relu_1_2"].activation


@pytest.mark.parametrize("name", ["tensors-00000.safetensors", "torchlens.json"])
def test_a_pipe_in_place_of_a_file_is_refused_not_waited_on(saved, name):
    import subprocess
    import sys

    if name != "torchlens.json":  # the index agrees with the pipe's size, so only its kind gives it away
        document = _index(saved)
        document["files"][name] = 0
        _write(saved, document)
    (saved / name).unlink()
    os.mkfifo(saved / name)
    # in a child process: a reader blocked on a pipe may hold the GIL, so no thread or alarm could stop it
    script = "import sys, torchlens as tl\nfor e in tl.load(sys.argv[1]): e.activation"
    try:
        done = subprocess.run([sys.executable, "-c", script, str(saved)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading waited on the pipe {name}")
    assert done.returncode != 0 and "HistoryFileError" in done.stderr and "not a regular file" in done.stderr, (
        done.stderr[-2000:]
    )


def test_a_malformed_generator_state_is_a_file_error_when_replayed(saved):
    document = _index(saved)
    _set_field(document, "relu_1_2", "rng_state", {"t": "tuple", "v": [1, None]})
    _write(saved, document)
    loaded = tl.load(saved)
    assert validate_history(loaded) is False  # that layer's replay fails with the reason; nothing else raises
    with pytest.raises(tl.HistoryFileError, match="the rng_state of layer relu_1_2 cannot be read: a tuple"):
        loaded["relu_1_2"].rng_state


# ----- a replayed operation produces only what its record declares (issue 41) ------------------
def _patch_stored_tensor(folder: pathlib.Path, number: int, data: bytes) -> None:
    """Overwrite tensor #number's bytes in its shard (same length) and fix its CRC: what someone
    who edits a folder on purpose does."""
    import struct
    import zlib

    document = _index(folder)
    record = document["tensors"][number]
    path = folder / record["file"]
    raw = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", raw[:8])[0]
    start, end = json.loads(raw[8 : 8 + header_len])[record["name"]]["data_offsets"]
    assert end - start == len(data)
    raw[8 + header_len + start : 8 + header_len + end] = data
    path.write_bytes(bytes(raw))
    record["crc"] = zlib.crc32(data)
    _write(folder, document)


_SPARSE_ATTACK = """
import pathlib, sys, torch, torchlens as tl
from torchlens.trace.rerun import RerunError
loaded = tl.load(sys.argv[1])
assert tl.validate_history(loaded) is False
try:
    loaded.rerun({"input_2_1": torch.tensor([3.0])})
except RerunError as error:
    assert "sparsecootensor_1_2" in str(error), error
    print("refused:", error)
else:
    raise AssertionError("rerun built the sparse tensor")
"""


@pytest.mark.parametrize("func", ["torch.sparse_coo_tensor", "torch.ops.aten._sparse_coo_tensor_unsafe.default"])
def test_sparse_indices_from_the_file_outside_the_size_do_not_crash(tmp_path, func):
    """Indices [[1000000000]] for a size (2,): torch densified them unchecked (exit 139)."""
    import subprocess
    import sys

    class MakesSparse(nn.Module):
        def forward(self, indices, values):
            return torch.sparse_coo_tensor(indices, values, (2,)) * 2

    with torch.sparse.check_sparse_tensor_invariants(enable=False):
        h = tl.log_forward_pass(MakesSparse(), (torch.tensor([[0]]), torch.tensor([1.0])), save_function_args=True)
    folder = pathlib.Path(h.save(tmp_path / "h"))
    document = _index(folder)
    _set_field(document, "sparsecootensor_1_2", "func", {"t": "func", "v": func})
    _write(folder, document)
    _patch_stored_tensor(folder, 0, torch.tensor([[1000000000]]).numpy().tobytes())
    done = subprocess.run(
        [sys.executable, "-c", _SPARSE_ATTACK, str(folder)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert "refused:" in done.stdout and ("invalid sparse tensor" in done.stdout or "inconsistent" in done.stdout)


def _peak_bytes(run) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _rss_growth(run) -> int:
    """Growth of the process's peak resident memory while ``run`` runs (torch allocates outside
    Python's allocator, so tracemalloc does not see tensors)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024


@pytest.mark.parametrize(
    "func,args",
    [
        ("torch.ones", [{"t": "size", "v": [1 << 28]}]),
        ("torch.zeros", [[1 << 14, 1 << 14]]),
        ("torch.Tensor.new_ones", [{"t": "parent", "v": "linear_1_1"}, [1 << 28]]),
        ("torch.Tensor.expand", [{"t": "parent", "v": "linear_1_1"}, [1 << 26, 2, 3]]),
        ("torch.ops.aten.ones.default", [[1 << 28]]),
    ],
)
def test_sizes_from_the_file_do_not_become_allocations(saved, func, args):
    """relu replaced by torch.ones([1 << 28]): validate allocated 1 GiB for a declared (2, 3)."""
    _tamper(saved, func, args)
    loaded = tl.load(saved)
    messages = []
    loaded_entry = loaded["relu_1_2"]
    assert _rss_growth(lambda: messages.append(validate_history(loaded))) < 256 << 20
    assert messages == [False]
    from torchlens.trace.replay import replay_entry

    result = replay_entry(loaded_entry, {e.label: e for e in loaded}, {})
    if func != "torch.Tensor.expand":  # a view makes no data: it fails only the comparison
        assert isinstance(result, str) and "refused" in result and "bytes, more than this replay may" in result


def test_a_sparse_record_with_a_huge_size_is_never_made_dense(tmp_path):
    """A sparse activation whose size was edited to [1 << 34] asked validate for 64 GiB."""

    class Sparse(nn.Module):
        def forward(self, x):
            return (x * 2).to_sparse() * 3

    h = tl.log_forward_pass(Sparse(), torch.tensor([1.0, 0.0]), save_function_args=True)
    folder = pathlib.Path(h.save(tmp_path / "h"))
    document = _index(folder)
    sparse = [r for r in document["tensors"] if r["kind"] == "sparse_coo"]
    assert sparse
    for record in sparse:
        record["size"] = [1 << 34]
    _write(folder, document)
    loaded = tl.load(folder)
    results = []
    assert _rss_growth(lambda: results.append(validate_history(loaded))) < 256 << 20
    assert results == [False]


def test_printing_operators_are_not_replayed(saved, capfd):
    """aten._print wrote the file's string (escape codes that clear the screen) to the terminal."""
    for name in ("torch.ops.aten._print.default", "torch.ops.aten._print", "torch._print"):
        _tamper(saved, name, ["\x1b[2J\x1b[Hpwned"])
        _validate_then_rerun(saved)
        loaded = tl.load(saved)
        assert isinstance(loaded["relu_1_2"].func, UnavailableFunction)
        assert "effect outside its result" in loaded["relu_1_2"].func.unavailable_reason
    assert "pwned" not in capfd.readouterr().out


def test_side_effects_inside_a_replayed_function_are_refused(capfd):
    """The guard sees the operators a composite function reaches, not only the saved name."""
    from torchlens.trace.replay_guard import ReplayGuard, ReplayRefusedError

    for _ in range(2):  # the second time from the verdict kept for the operator
        with pytest.raises(ReplayRefusedError, match="effect outside its result"):
            with ReplayGuard(limit_bytes=1 << 20):
                torch.ops.aten._print("\x1b[2Jpwned")
    assert "pwned" not in capfd.readouterr().out


def test_the_guard_finds_the_tensors_of_an_operator_call_as_tree_flatten_does():
    """The guard opens every operator's arguments with its own small function: the same leaves,
    in the same order, as torch's tree_flatten, or a tensor could escape the byte bound."""
    import collections

    from torch.utils._pytree import tree_flatten

    from torchlens.trace.replay_guard import leaves_of

    pair = collections.namedtuple("pair", "a b")
    t = [torch.ones(i + 1) for i in range(4)]
    calls = [
        ((t[0], [t[1], None], 3), {"dim": [0, 1], "out": t[2]}),
        ((), {}),
        ((torch.Size([2, 3]), (1, (2, [t[3]]))), {"a": {"b": t[0]}}),
        ((pair(1, t[1]), collections.OrderedDict(x=t[2], y=[t[3], "s"])), {"k": (None, 2.5)}),
    ]
    for args, kwargs in calls:
        ours, torchs = leaves_of(args, kwargs), tree_flatten((args, kwargs))[0]
        assert len(ours) == len(torchs)
        assert all(a is b or (not isinstance(a, torch.Tensor) and a == b) for a, b in zip(ours, torchs))


def test_a_parent_swapped_for_another_shape_is_refused_before_the_call(saved):
    document = _index(saved)
    _record_of(document, "linear_1_1")["shape"] = [3, 2]  # same bytes, another shape than its record says
    _write(saved, document)
    loaded = tl.load(saved)
    from torchlens.trace.replay import replay_entry

    result = replay_entry(loaded["relu_1_2"], {e.label: e for e in loaded}, {})
    assert isinstance(result, str) and "declares (2, 3)" in result


_IMPORT_CHECK = """
import sys, torch, torchlens as tl
before = {m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo"))}
try:
    tl.load(sys.argv[1])
except tl.HistoryFileError as error:
    print("refused:", error)
after = {m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo"))}
print("imported:", sorted(after - before)[:5])
"""


@pytest.mark.parametrize(
    "value",
    [
        {"t": "torch", "v": "_inductor"},
        {"t": "torch", "v": "_dynamo"},
        {"t": "dtype", "v": "_inductor"},
        {"t": "meta", "shape": [1], "dtype": "_dynamo"},
    ],
)
def test_loading_imports_nothing(saved, value):
    """{"t": "torch", "v": "_inductor"} made tl.load import torch._inductor and torch._dynamo."""
    import subprocess
    import sys

    document = _index(saved)
    document["history"]["notes"] = [value]
    _write(saved, document)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK, str(saved)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "imported: []" in done.stdout, done.stdout


def test_control_characters_in_names_are_shown_not_sent(tmp_path):
    """A module name with escape codes reached the terminal raw and made dot fail."""
    model = nn.Sequential()
    model.add_module("a\x1b[2J\x07\x9bb", nn.Linear(2, 2))
    h = tl.log_forward_pass(model, torch.ones(1, 2))
    loaded = tl.load(h.save(tmp_path / "h"))
    for history in (h, loaded):
        for text in (str(history), history.summary(), str(history["linear_1_1"])):
            assert not any(c in text for c in "\x1b\x07\x9b"), repr(text)
            assert "\u241b[2J" in text
    import shutil as _shutil

    if _shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed")
    out = tmp_path / "graph"
    tl.render_graph(loaded, vis_outpath=str(out), vis_fileformat="svg", vis_save_only=True)
    assert "\u241b[2J" in (tmp_path / "graph.svg").read_text()


def test_print_layers_shows_control_characters(tmp_path, capsys):
    model = nn.Sequential()
    model.add_module("x\x1b]0;title\x07", nn.ReLU())
    tl.log_forward_pass(model, torch.ones(1, 2)).print_layers()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u241b]0;title\u2407" in out
