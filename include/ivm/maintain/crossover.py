"""`--mode auto`'s choice between incremental maintenance and a full recompute, from the view's measured
costs (the benchmark issue: "chooses incremental or full per view from measured costs (the crossover)
and records both estimates in the run").

The measurements are the view's own maintain stages in earlier succeeded runs (the catalog's run
stages): each incremental one gives (rows in the input deltas, seconds), each full one the seconds of
a recompute. The incremental estimate for this run's change is a least-squares line through the
incremental points, T = a + b·|Δ| (a: the fixed costs of a refresh, b: its cost per changed row;
both kept ≥ 0), or their mean while they do not span two change sizes; the full estimate is the
newest recompute's time (the data grows; the newest is the nearest). A full recompute is chosen
when it is estimated to save at least ``min_saving_seconds`` and the incremental estimate is over
``ratio`` times the full one; both estimates, the points they came from and the decision go into the
run's record. With no measurement of either kind yet, the run stays incremental and says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ivm.config import CrossoverSettings


@dataclass
class Estimate:
    change_rows: int
    incremental_s: float | None
    full_s: float | None
    points: int  # incremental runs measured
    full: bool
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of the least-squares line seconds = a + b·rows, both ≥ 0; (mean, 0) without two sizes."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return my, 0.0
    b = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx)
    a = my - b * mx
    if a < 0:  # through the origin instead: all of it per row
        a, b = 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return a, b


def estimate(points: list[tuple[int, float]], full_s: float | None, change_rows: int,
             settings: CrossoverSettings) -> Estimate:
    """``points``: (rows in, seconds) of the view's newest incremental maintain stages; ``full_s``: its
    newest recompute's seconds (None: none measured)."""
    points = points[:settings.history]
    inc_s = None
    if points:
        a, b = fit(points)
        inc_s = a + b * change_rows
    if inc_s is None or full_s is None:
        missing = "an incremental refresh" if inc_s is None else "a full recompute"
        return Estimate(change_rows, inc_s, full_s, len(points), False, f"no measurement of {missing} yet")
    saving = inc_s - full_s
    full = saving >= settings.min_saving_seconds and inc_s > settings.ratio * full_s
    why = (f"estimated {inc_s:.1f} s incremental for {change_rows:,} changed rows (from {len(points)} measured "
           f"refreshes) against {full_s:.1f} s for a full recompute: "
           + ("the recompute is cheaper" if full else "incremental" + (
               "" if saving <= 0 else f" (a recompute would save under {settings.min_saving_seconds:g} s "
                                      f"or {settings.ratio:g}×)")))
    return Estimate(change_rows, round(inc_s, 3), round(full_s, 3), len(points), full, why)
