"""Statistics shared by the tests that check distributions (fixed seeds, stated tolerances)."""

from __future__ import annotations

from statistics import NormalDist


def chi2_critical(df: int, alpha: float) -> float:
    """Upper ``alpha`` quantile of chi-square(df), Wilson-Hilferty approximation."""
    z = NormalDist().inv_cdf(1 - alpha)
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
