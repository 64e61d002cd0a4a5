from typing import Optional, Tuple

def finite_moments(address: int, n: int, wide: bool) -> Optional[Tuple[float, float, float, float, int]]:
    """(mean, m2, min, max, zeros) of ``n`` float32 (float64 if ``wide``) values at ``address``,
    or None if one of them is not finite."""
