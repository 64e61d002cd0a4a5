"""Saves that a killed process did not finish: recognised, named, and cleaned up.

``history.save`` writes into a hidden staging folder next to its target and moves it into place
at the end; ``save_to=`` writes into its folder while the pass runs. A process killed meanwhile
(``kill -9``, a lost machine) leaves that folder behind. Each carries an owner file naming the
host and process that wrote it, so that:

* the next ``save`` into the same parent folder removes staging folders whose writer is dead
  (on this host: a folder shared between machines is never cleaned from another one);
* ``save_to=`` into a folder left by an unfinished save says so, and that it can be removed.

Example:
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> mark_unfinished(folder)
    >>> unfinished_writer(folder) == (socket.gethostname(), os.getpid())
    True
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Optional, Tuple

STAGING_PREFIX = ".torchlens-saving-"
OWNER_FILE = "torchlens.saving"  # inside a folder being written; removed when the save finishes


def mark_unfinished(folder: str) -> None:
    """Record in ``folder`` that this process is writing it (see ``unfinished_writer``)."""
    with open(os.path.join(folder, OWNER_FILE), "w", encoding="utf-8") as handle:
        handle.write(f"{socket.gethostname()}\n{os.getpid()}\n")


def mark_finished(folder: str) -> None:
    """The save of ``folder`` is complete: its owner file goes."""
    try:
        os.remove(os.path.join(folder, OWNER_FILE))
    except FileNotFoundError:
        pass


def unfinished_writer(folder: str) -> Optional[Tuple[str, int]]:
    """(host, process id) of the save that was writing ``folder`` and did not finish, or None."""
    try:
        with open(os.path.join(folder, OWNER_FILE), encoding="utf-8") as handle:
            host, pid = handle.read(4096).split("\n")[:2]
        return host, int(pid)
    except (OSError, ValueError):
        return None


def writer_is_gone(writer: Tuple[str, int]) -> bool:
    """The process of ``writer`` ran on this host and no longer exists."""
    host, pid = writer
    if host != socket.gethostname() or pid <= 0:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, owned by someone else
        return False
    return False


def make_staging(parent: str) -> str:
    """A new hidden staging folder in ``parent``, marked as this process's."""
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=parent)
    mark_unfinished(staging)
    return staging


def remove_abandoned_staging(parent: str) -> int:
    """Remove the staging folders in ``parent`` whose writer was killed; how many went."""
    removed = 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(parent, name)
        if not name.startswith(STAGING_PREFIX) or os.path.islink(path) or not os.path.isdir(path):
            continue
        writer = unfinished_writer(path)
        if writer is not None and writer_is_gone(writer):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


__all__ = [
    "STAGING_PREFIX",
    "OWNER_FILE",
    "mark_unfinished",
    "mark_finished",
    "unfinished_writer",
    "writer_is_gone",
    "make_staging",
    "remove_abandoned_staging",
]
