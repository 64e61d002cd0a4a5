"""Where an export goes: the format a path asks for, refusing to replace a file unless asked,
and writing through a temporary file so a failed export leaves nothing half-written."""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

from ...errors import TorchlensError


class ExportError(TorchlensError, ValueError):
    """An export that cannot be made as asked (unknown format, a history it cannot describe)."""


class ExportExistsError(TorchlensError, FileExistsError):
    """The export's target file exists; ``overwrite=True`` replaces it."""


class MissingPackageError(TorchlensError, ImportError):
    """The format needs a package that is not installed (the message says which extra)."""


# the file endings each format is chosen by when ``format`` is not given
SUFFIXES: Dict[str, str] = {
    ".onnx": "netron",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def pick_format(path: str, fmt: Optional[str], known: Tuple[str, ...]) -> str:
    """The format to write: ``fmt``, else the one the file ending names."""
    if fmt is None:
        fmt = SUFFIXES.get(os.path.splitext(path)[1].lower())
        if fmt is None:
            raise ExportError(
                f"cannot tell the export format from {os.path.basename(path)!r}; pass format= one of "
                f"{', '.join(known)} (.onnx and .parquet files are recognised by their ending)."
            )
    if fmt not in known:
        raise ExportError(f"unknown export format {fmt!r}; known formats: {', '.join(known)}.")
    return fmt


def check_target(path: str, overwrite: bool) -> str:
    """``path`` as a string, refused when it exists (unless ``overwrite``) or is a folder."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path} is a folder; export writes one file: give a file name.")
    if os.path.exists(path) and not overwrite:
        raise ExportExistsError(f"{path} exists; pass overwrite=True to replace it.")
    return path


def require(package: str, extra: str, why: str):
    """Import ``package`` or raise ``MissingPackageError`` naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        raise MissingPackageError(
            f"{why} needs {package}: pip install 'torchlens[{extra}]' (or pip install {package})."
        ) from None
