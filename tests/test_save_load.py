"""history.save / tl.load: round trips, lazy reading, and a clear error for every broken file."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.render import build_dot
from torchlens.trace.storage.codec import Unsaved
from torchlens.trace.storage.shards import TensorStore


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        z = y + torch.sigmoid(y)
        return self.fc(z.mean((2, 3))), z.sum()


class Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(3):
            x = self.fc(x) + 1
        return x * 2


class Kinds(nn.Module):
    """Activations safetensors has no plain dtype or layout for."""

    def forward(self, x):
        s = x.to_sparse()
        c = x.to(torch.complex128) * 2
        b = x.to(torch.bfloat16) + 1
        n = x > 0.5
        return s * 2, c, b, n, x.t()  # x.t(): a non-contiguous view


def _same_text(a: tl.ModelHistory, b: tl.ModelHistory) -> None:
    assert str(a) == str(b)
    for x, y in zip(a, b):
        assert str(x) == str(y)
        assert [repr(f) for f in x.func_call_stack] == [repr(f) for f in y.func_call_stack]


def _bitwise(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if a.layout != torch.strided:
            a, b = a.to_dense(), b.to_dense()
        a, b = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
        return a.dtype == b.dtype and bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
    return a == b


@pytest.mark.parametrize("model,x", [(Branchy(), torch.rand(2, 3, 6, 6)), (Loop(), torch.rand(2, 3))])
def test_round_trip_is_identical(tmp_path, model, x):
    h = tl.log_forward_pass(model, x, save_function_args=True, random_seed=1)
    loaded = tl.load(h.save(tmp_path / "h"))
    assert loaded.layer_labels == h.layer_labels
    _same_text(h, loaded)
    assert h.to_pandas().equals(loaded.to_pandas())
    assert build_dot(h).source == build_dot(loaded).source
    assert build_dot(h, vis_mode="rolled").source == build_dot(loaded, vis_mode="rolled").source
    assert set(h._lookup) == set(loaded._lookup)
    for key in h._lookup:
        if key in h and not isinstance(h._lookup[key], type(None)):
            try:
                expected = h[key].label
            except KeyError as error:
                with pytest.raises(KeyError) as found:
                    loaded[key]
                assert str(found.value) == str(error)
                continue
            assert loaded[key].label == expected
    for a, b in zip(h, loaded):
        assert (a.activation is None) == (b.activation is None)
        if a.activation is not None:
            assert _bitwise(a.activation, b.activation) and a.activation.shape == b.activation.shape
    with pytest.raises(KeyError, match="Did you mean"):
        loaded["lineer_1_1"]


def test_unusual_tensors_are_bitwise_equal(tmp_path):
    h = tl.log_forward_pass(Kinds(), torch.rand(3, 4), random_seed=0)
    loaded = tl.load(h.save(tmp_path / "k"))
    for a, b in zip(h, loaded):
        assert _bitwise(a.activation, b.activation), a.label
        assert a.activation.layout == b.activation.layout


def test_gradients_round_trip(tmp_path):
    h = tl.log_forward_pass(Branchy(), torch.rand(2, 3, 6, 6), save_gradients=True, random_seed=0)
    h[h.output_layers[0]].activation.sum().backward()
    loaded = tl.load(h.save(tmp_path / "g"))
    grads = [e for e in h if e.gradient is not None]
    assert grads
    for a in grads:
        b = loaded[a.label]
        assert b.has_gradient and b.grad_shape == a.grad_shape and b.grad_nbytes == a.grad_nbytes
        assert torch.equal(a.gradient, b.gradient)
    _same_text(h, loaded)
    assert build_dot(h).source == build_dot(loaded).source


def test_source_text_is_stored(tmp_path, monkeypatch):
    source = tmp_path / "mymodel.py"
    source.write_text(
        "import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.tanh(x)  # the call\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("mymodel")
    h = tl.log_forward_pass(module.M(), torch.rand(2), random_seed=0)
    folder = h.save(tmp_path / "s")
    source.write_text("# rewritten\n" * 10)  # the model file changes after the save
    import linecache

    linecache.clearcache()
    loc = tl.load(folder)["tanh_1_1"].func_call_stack[-1]
    assert loc.code_line == "return torch.tanh(x)  # the call"
    assert loc.function == "forward" and loc.file == str(source) and loc.line_number == 5
    last = repr(loc).splitlines()[-1]
    assert last.lstrip().startswith("--->") and last.endswith("return torch.tanh(x)  # the call")


def test_loading_reads_no_tensor_until_used(tmp_path, monkeypatch):
    h = tl.log_forward_pass(Branchy(), torch.rand(2, 3, 6, 6), save_function_args=True, random_seed=0)
    folder = h.save(tmp_path / "lazy")
    reads = []
    original = TensorStore.dense
    monkeypatch.setattr(
        TensorStore, "dense", lambda self, key, record: reads.append(key) or original(self, key, record)
    )
    loaded = tl.load(folder)
    str(loaded), loaded.to_pandas(), build_dot(loaded), loaded.num_tensors_saved, loaded.saved_tensor_bytes
    assert reads == []
    assert loaded.saved_tensor_bytes == h.saved_tensor_bytes
    loaded["relu_1_5"].activation
    assert len(reads) == 1


def test_postfunc_results_are_stored_safely(tmp_path):
    h = tl.log_forward_pass(
        Loop(),
        torch.rand(2, 3),
        random_seed=0,
        activation_postfunc=lambda t: {"mean": t.mean(), "shape": t.shape, "n": (1, 2.5, None)},
    )
    loaded = tl.load(h.save(tmp_path / "p"))
    for a, b in zip(h, loaded):
        assert set(a.activation) == set(b.activation)
        assert torch.equal(a.activation["mean"], b.activation["mean"])
        assert b.activation["shape"] == a.activation["shape"] and b.activation["n"] == (1, 2.5, None)


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


def test_unsaveable_values_are_named_not_dropped(tmp_path):
    h = tl.log_forward_pass(Loop(), torch.rand(2, 3), random_seed=0, activation_postfunc=lambda t: Opaque())
    with pytest.warns(tl.UnsavedValuesWarning, match=r"input_1_0\.activation: .*Opaque"):
        folder = h.save(tmp_path / "u")
    loaded = tl.load(folder)
    value = loaded["linear_1_1:1"].activation
    assert isinstance(value, Unsaved) and value.text == "Opaque()" and value.type_name.endswith("Opaque")
    assert any("could not be saved" in note for note in loaded.notes)
    assert "could not be saved" in str(loaded)


def test_saved_files_are_json_and_safetensors_only(tmp_path):
    from safetensors import safe_open

    h = tl.log_forward_pass(Branchy(), torch.rand(2, 3, 6, 6), save_function_args=True, random_seed=0)
    folder = h.save(tmp_path / "f")
    names = sorted(os.listdir(folder))
    assert names[0] == "tensors-00000.safetensors" and names[-1] == "torchlens.json"
    assert all(n.endswith(".safetensors") for n in names[:-1])
    index = json.load(open(os.path.join(folder, "torchlens.json")))
    assert index["format_version"] == 1
    record = index["tensors"][0]
    with safe_open(os.path.join(folder, record["file"]), framework="pt") as f:  # plain safetensors
        assert f.get_tensor(record["name"]).shape == tuple(record["shape"])


def test_existing_folders_are_not_overwritten_by_accident(tmp_path):
    h = tl.log_forward_pass(Loop(), torch.rand(2, 3), random_seed=0)
    folder = h.save(tmp_path / "o")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        h.save(folder)
    h.save(folder, overwrite=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a saved torchlens history"):
        h.save(other, overwrite=True)
    assert (other / "notes.txt").read_text() == "mine"


# ----- broken files: every error names the file ---------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    h = tl.log_forward_pass(Branchy(), torch.rand(2, 3, 6, 6), random_seed=0)
    return h.save(tmp_path / "b")


def test_missing_index(saved):
    os.remove(os.path.join(saved, "torchlens.json"))
    with pytest.raises(tl.HistoryFileError, match=r"torchlens\.json: missing"):
        tl.load(saved)


def test_truncated_index(saved):
    path = os.path.join(saved, "torchlens.json")
    text = open(path).read()
    open(path, "w").write(text[: len(text) // 2])
    with pytest.raises(tl.HistoryFileError, match=r"torchlens\.json: truncated or corrupted") as error:
        tl.load(saved)
    assert error.value.path == path


def test_newer_format_version(saved):
    path = os.path.join(saved, "torchlens.json")
    index = json.load(open(path))
    index["format_version"] = 99
    json.dump(index, open(path, "w"))
    with pytest.raises(tl.HistoryFileError, match=r"torchlens\.json: written in format version 99.*upgrade"):
        tl.load(saved)


def test_not_a_history(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "torchlens.json").write_text('{"hello": 1}')
    with pytest.raises(tl.HistoryFileError, match="not a torchlens history"):
        tl.load(folder)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        tl.load(tmp_path / "nowhere")


def test_missing_tensor_file(saved):
    os.remove(os.path.join(saved, "tensors-00000.safetensors"))
    with pytest.raises(tl.HistoryFileError, match=r"tensors-00000\.safetensors: the tensor file is missing"):
        tl.load(saved)


def test_truncated_tensor_file(saved):
    path = os.path.join(saved, "tensors-00000.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(tl.HistoryFileError, match=r"tensors-00000\.safetensors: the tensor file is truncated"):
        tl.load(saved)


def test_corrupted_tensor_bytes(saved):
    path = os.path.join(saved, "tensors-00000.safetensors")
    with open(path, "r+b") as f:
        header = struct.unpack("<Q", f.read(8))[0]
        f.seek(8 + header + 5)
        byte = f.read(1)
        f.seek(8 + header + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    loaded = tl.load(saved)  # opening reads no tensor data
    with pytest.raises(
        tl.HistoryFileError,
        match=r"tensors-00000\.safetensors: the activation of layer input_1_0 cannot be read: tensor 't0' is corrupted",
    ):
        loaded[0].activation


def test_a_corrupted_tensor_is_named_by_its_layer_and_field(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    h = tl.log_forward_pass(model, torch.rand(2, 3), save_gradients=True, random_seed=0)
    h[h.output_layers[0]].activation.sum().backward()
    folder = h.save(tmp_path / "g")
    index = json.load(open(os.path.join(folder, "torchlens.json")))
    path = os.path.join(folder, "tensors-00000.safetensors")
    for field in ("activation", "gradient"):
        fields = index["entry_fields"]
        row = next(r for r in index["entries"] if r[fields.index("label")] == "relu_1_2")
        record = index["tensors"][row[fields.index(field)]["k"]]  # stored as {"t": "tensor", "k": number}
        with open(path, "r+b") as f:  # flip the first byte of that tensor's data
            header = struct.unpack("<Q", f.read(8))[0]
            f.seek(8)
            start = json.loads(f.read(header))[record["name"]]["data_offsets"][0]
            f.seek(8 + header + start)
            byte = f.read(1)
            f.seek(8 + header + start)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(tl.HistoryFileError) as info:
            getattr(tl.load(folder)["relu_1_2"], field)
        assert f"{field} of layer relu_1_2" in str(info.value) and "corrupted" in str(info.value), str(info.value)
        assert info.value.path == path


def test_corrupted_tensor_header(saved):
    path = os.path.join(saved, "tensors-00000.safetensors")
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(b"#garbage#")
    loaded = tl.load(saved)
    with pytest.raises(
        tl.HistoryFileError, match=r"tensors-00000\.safetensors: the activation of .* not a readable safetensors file"
    ):
        loaded[1].activation


# ----- saves a killed process did not finish; a full disk (issue 41) ---------------------------
_KILLED_SAVE = """
import os, sys, torch, torchlens as tl
from torchlens.trace.storage import save as save_module, stream as stream_module
h = tl.log_forward_pass(torch.nn.Linear(64, 64), torch.rand(4, 64))
real = save_module.write_index
def killed(folder, *args, **kwargs):
    print(folder, flush=True)
    os.kill(os.getpid(), 9)  # as kill -9 does, in the middle of the save
save_module.write_index = stream_module.write_index = killed
if sys.argv[2] == "save":
    h.save(sys.argv[1])
else:
    tl.log_forward_pass(torch.nn.Linear(64, 64), torch.rand(4, 64), save_to=sys.argv[1])
"""


def _killed_while_saving(target, how: str) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _KILLED_SAVE, str(target), how], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == -9, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_killed_save_leaves_staging_that_the_next_save_removes(tmp_path):
    staging = _killed_while_saving(tmp_path / "h", "save")
    assert os.path.basename(staging).startswith(".torchlens-saving-") and os.path.isdir(staging)
    h = tl.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2))
    h.save(tmp_path / "other")
    assert sorted(os.listdir(tmp_path)) == ["other"]
    assert sorted(os.listdir(tmp_path / "other")) == sorted(
        n for n in os.listdir(tmp_path / "other") if n.startswith("tensors-") or n == "torchlens.json"
    )


def test_staging_of_a_save_still_running_is_left_alone(tmp_path):
    from torchlens.trace.storage.unfinished import make_staging

    mine = make_staging(str(tmp_path))  # this process is alive: its staging is not abandoned
    tl.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2)).save(tmp_path / "h")
    assert os.path.isdir(mine)


def test_save_to_names_an_unfinished_save_and_says_it_can_be_removed(tmp_path):
    target = tmp_path / "run"
    _killed_while_saving(target, "save_to")
    assert target.is_dir() and not (target / "torchlens.json").exists()
    with pytest.raises(FileExistsError, match=r"holds an unfinished torchlens save .* can be removed"):
        tl.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2), save_to=target)
    with pytest.raises(tl.HistoryFileError, match="did not finish"):
        tl.load(target)


def test_a_finished_save_carries_no_owner_file(tmp_path):
    h = tl.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2), save_to=tmp_path / "a")
    h.save(tmp_path / "b")
    for folder in ("a", "b"):
        assert "torchlens.saving" not in os.listdir(tmp_path / folder)


_FULL_DISK = """
import os, resource, signal, sys, torch, torchlens as tl
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
try:  # small tensors: the write that fails leaves bytes buffered, which closing the shard fails to write again
    tl.log_forward_pass(torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(200)]), torch.rand(4, 8),
                        save_to=sys.argv[1], save_function_args=True)
except OSError as error:
    print("failed:", error)
"""


def test_save_to_on_a_full_disk_leaves_nothing(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path / "run")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "failed:" in done.stdout, done.stdout + done.stderr[-2000:]
    assert not (tmp_path / "run").exists(), os.listdir(tmp_path / "run")


def test_an_index_larger_than_any_torchlens_writes_is_not_read(tmp_path):
    import importlib

    load_module = importlib.import_module("torchlens.trace.storage.load")
    h = tl.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2))
    folder = h.save(tmp_path / "h")
    with open(os.path.join(folder, "torchlens.json"), "r+b") as handle:
        handle.truncate(8 << 30)  # a sparse file: 8 GiB long, nothing on disk
    assert load_module.MAX_INDEX_BYTES < 8 << 30
    with pytest.raises(tl.HistoryFileError, match="more than any index torchlens writes"):
        tl.load(folder)
