"""How the terminal report writes numbers (None, for "cannot be computed", prints as "-") and
the fairness lines of a result (`format_fairness`)."""

from __future__ import annotations

from typing import Any


def fmt_int(v: Any) -> str:
    return "-" if v is None else f"{v:d}"


def fmt_float(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def fmt_ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1000:.2f}"


def fmt_seconds(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def format_fairness(fairness: dict) -> list[str]:
    """Two lines on a result's `fairness`: Jain's index (min and mean over the windows) and the
    largest weighted-service gap between backlogged tenants, then the worst window (lowest Jain's
    index) with its span, index and gap."""
    lines = [
        f"fairness over {fmt_seconds(fairness.get('window_s'))} s windows: Jain min "
        f"{fmt_float(fairness.get('min_jain'), 3)}, mean {fmt_float(fairness.get('mean_jain'), 3)}; "
        f"max service gap {fmt_float(fairness.get('max_service_gap'), 1)} tokens"
    ]
    rated = [w for w in fairness.get("windows") or () if w.get("jain") is not None]
    if rated:
        worst = min(rated, key=lambda w: w["jain"])
        lines.append(
            f"worst window {worst['start_s']:.1f}-{worst['end_s']:.1f} s: Jain {worst['jain']:.3f}, "
            f"gap {fmt_float(worst.get('max_service_gap'), 1)} tokens over {len(worst.get('backlogged') or ())} "
            "backlogged tenants"
        )
    return lines
