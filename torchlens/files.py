"""Writing a file whole or not at all: what every export of torchlens does.

Example:
    >>> import os, pathlib, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "out.txt")
    >>> def write(staging):
    ...     with open(staging, "w") as handle:
    ...         handle.write("done")
    >>> pathlib.Path(write_atomically(path, write)).read_text()
    'done'
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable


def write_atomically(path: str, write: Callable[[str], None]) -> str:
    """Call ``write(temporary path)`` next to ``path``, then move the file into place: a reader
    never sees half a file, and a failed write leaves nothing behind."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=".torchlens-export-", dir=folder)
    os.close(fd)
    try:
        write(staging)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    return path


__all__ = ["write_atomically"]
