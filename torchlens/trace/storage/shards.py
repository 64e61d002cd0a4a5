"""Tensors on disk: safetensors shards written one tensor at a time, read back lazily.

A shard is a standard safetensors file (any safetensors reader opens it). It is written as a
stream so that a tensor can go to disk the moment it exists (``save_to=``): the header space is
reserved at the start of the file (the format allows a header padded with spaces), tensor bytes
are appended as they come, and the header is filled in when the shard is closed. A shard closes
when its header space or its byte budget is full.

Tensors safetensors has no dtype for (``complex128``, ``uint1``...) are stored as their raw
bytes (``U8``) with the real dtype kept in torchlens's index; every tensor's CRC-32 is kept
too and checked when it is first read, so a corrupted file is reported, not silently used.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from typing import Any, Dict, Optional, Tuple

import torch

from .errors import HistoryFileError

# safetensors dtype names (the ones every safetensors >= 0.4 reader knows)
_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_HEADER_RESERVE = 64 * 1024  # bytes of header per shard: room for a few hundred tensors
_SHARD_BYTES = 1 << 30  # a new shard after about 1 GiB


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``'float32'``."""
    return str(dtype).replace("torch.", "")


def dtype_of(name: str, where: str) -> torch.dtype:
    """The torch dtype called ``name``; a clear error (naming ``where``) for anything else."""
    # the module's own dict: getattr would run torch's lazy importer (``torch._inductor``...)
    value = vars(torch).get(name) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise HistoryFileError(where, f"unknown tensor dtype {name!r} (written by a newer torch?)")
    return value


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a dense tensor, in row-major order, as a flat CPU ``uint8`` tensor."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


class ShardWriter:
    """Appends dense tensors to numbered safetensors files in ``folder``.

    Example:
        >>> import tempfile, torch
        >>> folder = tempfile.mkdtemp()
        >>> writer = ShardWriter(folder)
        >>> ref = writer.add(torch.arange(3.0))
        >>> writer.close()
        >>> ref["file"], ref["shape"], ref["dtype"]
        ('tensors-00000.safetensors', [3], 'float32')
    """

    def __init__(self, folder: str, shard_bytes: int = _SHARD_BYTES) -> None:
        self.folder = folder
        self.shard_bytes = shard_bytes
        self.files: Dict[str, int] = {}  # finished shard -> its size in bytes
        self.bytes_written = 0
        self._count = 0
        self._file: Any = None
        self._name = ""
        self._header: Dict[str, Any] = {}
        self._header_len = 0
        self._offset = 0

    def _open(self) -> None:
        self._name = f"tensors-{len(self.files):05d}.safetensors"
        self._file = open(os.path.join(self.folder, self._name), "wb")
        self._file.seek(8 + _HEADER_RESERVE)
        self._header = {"__metadata__": {"format": "pt", "written_by": "torchlens"}}
        self._header_len = len(json.dumps(self._header)) + 2
        self._offset = 0

    def add(self, tensor: torch.Tensor) -> Dict[str, Any]:
        """Write one dense tensor now; returns its index record (file, name, dtype, shape, crc)."""
        data = tensor_bytes(tensor)
        native = _ST_DTYPES.get(tensor.dtype)
        shape = list(tensor.shape)
        name = f"t{self._count}"
        entry = {
            "dtype": native or "U8",
            "shape": shape if native else [data.numel()],
            "data_offsets": [self._offset, self._offset + data.numel()],
        }
        entry_len = len(json.dumps({name: entry})) + 1
        if self._file is not None and (
            self._header_len + entry_len > _HEADER_RESERVE
            or self._offset + data.numel() > self.shard_bytes
            and self._offset
        ):
            self._close_shard()
        if self._file is None:
            self._open()
            entry["data_offsets"] = [0, data.numel()]
        array = data.numpy().data  # a memoryview of the bytes: no copy
        self._file.write(array)
        self._header[name] = entry
        self._header_len += entry_len
        self._offset += data.numel()
        self._count += 1
        self.bytes_written += data.numel()
        return {
            "file": self._name,
            "name": name,
            "dtype": dtype_name(tensor.dtype),
            "shape": shape,
            "crc": zlib.crc32(array),
        }

    def _close_shard(self) -> None:
        header = json.dumps(self._header, separators=(",", ":")).encode()
        if len(header) > _HEADER_RESERVE:  # cannot happen: add() closes the shard before
            raise RuntimeError("torchlens: safetensors header overflow")
        self._file.seek(0)
        self._file.write(struct.pack("<Q", _HEADER_RESERVE) + header.ljust(_HEADER_RESERVE, b" "))
        self._file.close()
        self.files[self._name] = 8 + _HEADER_RESERVE + self._offset
        self._file = None

    def close(self) -> None:
        """Finish the open shard (its header is written now)."""
        if self._file is not None:
            self._close_shard()

    def abort(self) -> None:
        """Close without finishing (after an error); the folder is left incomplete. Never raises:
        on a full disk closing flushes and fails again, and the caller still has to clean up."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


def inside_folder(folder: str, name: Any) -> str:
    """The path of file ``name`` of a saved folder, refused (``HistoryFileError``) unless it is a
    plain file name that stays in ``folder``: no ``..``, no separators or absolute paths, no
    symlink leading out. A folder from someone else must not make torchlens read other files.

    Example:
        >>> import tempfile
        >>> inside_folder(tempfile.mkdtemp(), "../secret.safetensors")
        Traceback (most recent call last):
        ...
        torchlens.trace.storage.errors.HistoryFileError: ...: the file name '../secret.safetensors' leads outside the saved folder ...
    """
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "\x00" in name
        or "/" in name
        or "\\" in name
        or os.sep in name
        or (os.altsep is not None and os.altsep in name)
        or os.path.isabs(name)
    ):
        raise HistoryFileError(
            os.path.join(folder, INDEX_NAME),
            f"the file name {str(name)[:120]!r} leads outside the saved folder (a saved history names only files "
            "inside its own folder); the folder was changed after it was saved",
        )
    path = os.path.join(folder, name)
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(folder):
        raise HistoryFileError(
            path,
            "a link to a file outside the saved folder (a saved history reads only files inside its own folder); "
            "copy the file into the folder instead of linking it",
        )
    if os.path.exists(real) and not os.path.isfile(real):  # a pipe or device would block or never end
        raise HistoryFileError(path, "not a regular file (a saved history is made of plain files)")
    return path


INDEX_NAME = "torchlens.json"
_KINDS = ("dense", "nested", "sparse_coo", "sparse_csr", "sparse_csc")
_PARTS = {"sparse_coo": ("indices", "values"), "sparse_csr": ("compressed", "plain", "values")}
_PARTS["sparse_csc"] = _PARTS["sparse_csr"]


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_shape(value: Any) -> bool:
    return type(value) is list and all(_is_count(n) for n in value)


def dense_nbytes(record: Dict[str, Any], where: str) -> int:
    """Bytes of a checked dense record's data (its shape times its dtype's size).

    Example:
        >>> dense_nbytes({"dtype": "float16", "shape": [2, 3]}, "run/torchlens.json")
        12
    """
    numel = 1
    for n in record["shape"]:
        numel *= n
    return numel * dtype_of(record["dtype"], where).itemsize


def check_record(record: Any, files: Dict[str, int], where: str) -> None:
    """A tensor index record is well formed, names a listed shard, and declares no more bytes
    than that shard holds: checked before any tensor is made, so a damaged index cannot make
    the loader allocate beyond the files' size (``HistoryFileError`` naming ``where``).

    Example:
        >>> record = {"kind": "dense", "file": "t.safetensors", "name": "t0", "dtype": "float32", "shape": [1 << 30], "crc": 0}
        >>> check_record(record, {"t.safetensors": 100}, "run/torchlens.json")
        Traceback (most recent call last):
        ...
        torchlens.trace.storage.errors.HistoryFileError: run/torchlens.json: tensor 't0' is said to hold 4294967296 bytes, more than its file t.safetensors (100 bytes): the index is corrupted
    """
    if not isinstance(record, dict) or record.get("kind") not in _KINDS:
        kind = record.get("kind") if isinstance(record, dict) else record
        raise HistoryFileError(where, f"unknown tensor kind {str(kind)[:40]!r} (written by a newer torchlens?)")
    kind = record["kind"]
    if kind == "dense":
        _check_dense(record, files, where)
    elif kind == "nested":
        parts = record.get("parts")
        if type(parts) is not list or not parts:
            raise HistoryFileError(where, "a nested tensor record without parts")
        for part in parts:
            _check_dense(part, files, where)
    else:
        if not _is_shape(record.get("size")):
            raise HistoryFileError(
                where, f"a {kind} tensor record with a malformed size {str(record.get('size'))[:40]}"
            )
        for part in _PARTS[kind]:
            _check_dense(record.get(part), files, where)
    for flag in ("requires_grad", "parameter"):
        if flag in record and type(record[flag]) is not bool:
            raise HistoryFileError(where, f"a tensor record whose {flag!r} is not true or false")


def _check_dense(record: Any, files: Dict[str, int], where: str) -> None:
    if not isinstance(record, dict):
        raise HistoryFileError(where, "a malformed tensor record")
    for key, ok in (
        ("file", lambda v: isinstance(v, str) and v in files),
        ("name", lambda v: isinstance(v, str)),
        ("dtype", lambda v: isinstance(v, str)),
        ("shape", _is_shape),
        ("crc", lambda v: _is_count(v) and v < 1 << 32),
    ):
        if not ok(record.get(key)):
            raise HistoryFileError(where, f"tensor {str(record.get('name'))[:40]!r}: malformed {key!r} in the index")
    nbytes = dense_nbytes(record, where)
    if nbytes > files[record["file"]]:
        raise HistoryFileError(
            where,
            f"tensor {record['name']!r} is said to hold {nbytes} bytes, more than its file "
            f"{record['file']} ({files[record['file']]} bytes): the index is corrupted",
        )


class TensorStore:
    """Reads tensors of a saved history lazily: each shard is opened (memory-mapped by
    safetensors) on first use, each tensor read and checked when first asked for. Only files
    inside ``folder`` are read (``inside_folder``)."""

    def __init__(self, folder: str, files: Dict[str, int]) -> None:
        self.folder = folder
        self.files = files
        self._open: Dict[str, Any] = {}
        self._cache: Dict[int, torch.Tensor] = {}
        # (file, name) -> (its bytes, their CRC-32): records naming the same stored tensor share
        # one copy, so an edited index cannot multiply the memory a folder takes
        self._bytes: Dict[Tuple[str, str], Tuple[torch.Tensor, int]] = {}
        self._copied = 0  # bytes of nested and sparse tensors built from the shards' data

    def charge_copy(self, nbytes: int, where: str) -> None:
        """Account for a tensor built by copying shard data (nested, sparse): together they may
        not exceed the shards' size, which a saved history never does."""
        self._copied += nbytes
        if self._copied > sum(self.files.values()):
            raise HistoryFileError(
                where, "the index builds more tensor data than its files hold (the same data used again and again)"
            )

    def check_files(self) -> None:
        """Every shard exists inside the folder and has the size recorded at save time (cheap:
        one stat each)."""
        for name, size in self.files.items():
            path = inside_folder(self.folder, name)
            if not _is_count(size):
                raise HistoryFileError(path, f"the index records a malformed size {str(size)[:40]!r} for this file")
            try:
                found = os.path.getsize(path)
            except OSError:
                raise HistoryFileError(path, "the tensor file is missing (the saved folder is incomplete)") from None
            if found != size:
                what = "truncated" if found < size else "longer than written"
                raise HistoryFileError(path, f"the tensor file is {what}: {found} bytes, {size} expected")

    def _shard(self, name: str):
        handle = self._open.get(name)
        if handle is None:
            from safetensors import safe_open

            path = inside_folder(self.folder, name)
            if name not in self.files:
                raise HistoryFileError(path, "a tensor refers to a file the index does not list")
            try:
                handle = self._open[name] = safe_open(path, framework="pt")
            except FileNotFoundError:
                raise HistoryFileError(path, "the tensor file is missing") from None
            except Exception as error:  # safetensors raises its own error types
                raise HistoryFileError(path, f"not a readable safetensors file ({error})") from None
        return handle

    def dense(self, key: int, record: Dict[str, Any]) -> torch.Tensor:
        """The dense tensor of index record ``record`` (cached: one object per tensor); its
        declared shape and dtype are checked against the shard's own before it is read."""
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        path = os.path.join(self.folder, str(record.get("file")))
        _check_dense(record, self.files, path)
        data, crc = self._stored_bytes(record, path)
        expected = dense_nbytes(record, path)
        if data.numel() != expected:
            raise HistoryFileError(
                path,
                f"tensor {record['name']!r} holds {data.numel()} bytes but the index describes {expected} "
                f"({record['dtype']} of shape {record['shape']}): the folder is corrupted",
            )
        if crc != record["crc"]:
            raise HistoryFileError(path, f"tensor {record['name']!r} is corrupted (its checksum does not match)")
        tensor = data.view(dtype_of(record["dtype"], path)).reshape(record["shape"])  # views: no copy
        self._cache[key] = tensor
        return tensor

    def _stored_bytes(self, record: Dict[str, Any], path: str) -> Tuple[torch.Tensor, int]:
        """The bytes of the stored tensor a record names, read once (after checking that the
        shard's own header gives it no more bytes than the file holds), with their CRC-32."""
        where = (record["file"], record["name"])
        found = self._bytes.get(where)
        if found is not None:
            return found
        handle = self._shard(record["file"])
        try:
            piece = handle.get_slice(record["name"])
            stored = _ST_BYTES[piece.get_dtype()]
            for n in piece.get_shape():
                stored *= n
            if stored > self.files[record["file"]]:
                raise ValueError(f"its header gives it {stored} bytes, more than the file holds")
            raw = handle.get_tensor(record["name"])
        except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
            raise HistoryFileError(path, f"tensor {record.get('name')!r} cannot be read ({error})") from None
        flat = raw.reshape(-1)
        data = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
        found = self._bytes[where] = (data, zlib.crc32(data.numpy().data))
        return found


# bytes per element of each safetensors dtype a shard may hold
_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def encode_tensor(tensor: torch.Tensor, writer: ShardWriter) -> Optional[Dict[str, Any]]:
    """The index record of any tensor: dense, sparse (its components) or nested (its pieces);
    ``None`` if its kind cannot be stored (quantized, a subclass without dense data)."""
    layout = tensor.layout
    try:
        if tensor.is_nested:
            return {"kind": "nested", "parts": [writer.add(t) for t in tensor.detach().unbind()]}
        if layout == torch.sparse_coo:
            t = tensor.detach().coalesce()
            return {
                "kind": "sparse_coo",
                "size": list(t.shape),
                "indices": writer.add(t._indices()),
                "values": writer.add(t._values()),
            }
        if layout in (torch.sparse_csr, torch.sparse_csc):
            t = tensor.detach()
            rows, cols = (
                (t.crow_indices(), t.col_indices())
                if layout == torch.sparse_csr
                else (t.ccol_indices(), t.row_indices())
            )
            return {
                "kind": str(layout).replace("torch.", ""),
                "size": list(t.shape),
                "compressed": writer.add(rows),
                "plain": writer.add(cols),
                "values": writer.add(t.values()),
            }
        if layout != torch.strided or tensor.is_quantized or tensor.device.type == "meta":
            return None
        record = writer.add(tensor)
        record["kind"] = "dense"
        return record
    except (RuntimeError, TypeError, NotImplementedError):  # a subclass or layout without plain data
        return None


def decode_tensor(record: Dict[str, Any], store: TensorStore, key: int, where: str) -> torch.Tensor:
    """The tensor an index record describes (the inverse of ``encode_tensor``); a record that
    does not make a valid tensor is a ``HistoryFileError``."""
    check_record(record, store.files, where)
    kind = record["kind"]
    if kind == "dense":
        return store.dense(key, record)
    parts = record["parts"] if kind == "nested" else [record[n] for n in _PARTS[kind]]
    store.charge_copy(sum(dense_nbytes(p, where) for p in parts), where)
    try:
        if kind == "nested":
            return torch.nested.nested_tensor([store.dense(_sub(key, i), p) for i, p in enumerate(record["parts"])])
        if kind == "sparse_coo":
            indices = store.dense(_sub(key, 0), record["indices"])
            values = store.dense(_sub(key, 1), record["values"])
            # invariants checked: the indices come from a file and must not crash torch if damaged
            return torch.sparse_coo_tensor(indices, values, record["size"], check_invariants=True).coalesce()
        parts = [store.dense(_sub(key, i), record[n]) for i, n in enumerate(_PARTS[kind])]
        make = torch.sparse_csr_tensor if kind == "sparse_csr" else torch.sparse_csc_tensor
        return make(parts[0], parts[1], parts[2], size=record["size"], check_invariants=True)
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        if isinstance(error, HistoryFileError):
            raise
        raise HistoryFileError(where, f"a {kind} tensor whose parts do not fit together ({error})") from None


def _sub(key: int, i: int) -> int:
    return -(key * 8 + i + 1)  # cache keys of a sparse or nested tensor's pieces: negative, distinct
