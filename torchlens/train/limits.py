"""The process's own limits that training tools run into: ``tl.setup`` raises the open-file
limit, which wandb's many files can exhaust."""

from __future__ import annotations

import sys

from ..arguments import require_bool, require_int


def setup(limit: int = 50_000, verbose: bool = True) -> int:
    """Raise this process's soft limit of open files to ``min(hard limit, limit)`` (wandb opens
    many files); call it before ``wandb.init()``. Returns the new soft limit.

    Example:
        >>> import torchlens as tl
        >>> tl.setup(verbose=False) >= 1
        True
    """
    require_int("limit", limit, "tl.setup", minimum=1, maximum=2**63 - 1)
    require_bool("verbose", verbose, "tl.setup")
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = limit if hard == resource.RLIM_INFINITY else min(hard, limit)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if verbose:
            print(f"torchlens.setup: open-file limit raised from {soft} to {target}.", file=sys.stderr)
        return target
    if verbose:
        print(f"torchlens.setup: open-file limit is already {soft}; nothing to do.", file=sys.stderr)
    return soft


__all__ = ["setup"]
