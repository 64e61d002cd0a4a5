"""What the machine has free: the one place torchlens reads it (the memory warning of a pass,
the command line's size check)."""

from __future__ import annotations

from typing import Optional


def available_memory() -> Optional[int]:
    """Bytes of host memory free for new allocations (``MemAvailable`` of /proc/meminfo, else
    psutil's figure), or None where that cannot be told.

    Example:
        >>> free = available_memory()
        >>> free is None or free > 0
        True
    """
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


__all__ = ["available_memory"]
