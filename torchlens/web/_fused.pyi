from typing import Optional, Tuple

def finite_moments(
    address: int, n: int, wide: bool, minus: int = 0
) -> Optional[Tuple[float, float, float, float, int]]:
    """(mean, m2, min, max, zeros) of ``n`` float32 (float64 if ``wide``) values at ``address``,
    less those at ``minus`` if given; None if one of them is not finite."""

def draw(address: int, n: int, wide: bool, minus: int, out: int, k: int, state: int) -> int:
    """Writes ``k`` of the ``n`` values at ``address`` (less those at ``minus`` if nonzero),
    picked at random with replacement, as float32 at ``out``; returns the random stream's next
    state."""

def draw_and_measure(
    address: int, n: int, wide: bool, minus: int, out: int, k: int, state: int
) -> Tuple[int, Optional[Tuple[float, float, float, float, int]]]:
    """``finite_moments`` and ``draw`` of the same values in one call: (the random stream's next
    state, the moments or None)."""

def copy(dest: int, source: int, nbytes: int) -> None:
    """Copies ``nbytes`` from ``source`` to ``dest`` with stores that go around the caches."""
