"""Is training healthy: ``run.health()`` reads a run for what looks wrong, where and since when
(``report``), and the NaN sentinel checks every step for NaN/Inf and replays the first bad one
to find where it started (``sentinel``).

Example:
    >>> from torchlens.train.health import SIGNALS, status_line
    >>> SIGNALS[0], status_line([])
    ('nonfinite', 'healthy: no finding')
"""

from .report import SIGNALS, findings, health, status_line
from .sentinel import (
    EVENTS_FILE,
    MODES,
    DivergenceWarning,
    NonfiniteError,
    NonfiniteWarning,
    Sentinel,
    SentinelLink,
    check_mode,
)

__all__ = [
    "health",
    "findings",
    "status_line",
    "SIGNALS",
    "Sentinel",
    "SentinelLink",
    "check_mode",
    "MODES",
    "EVENTS_FILE",
    "NonfiniteError",
    "NonfiniteWarning",
    "DivergenceWarning",
]
