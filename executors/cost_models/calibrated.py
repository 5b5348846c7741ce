"""The `calibrated` cost model: the linear model fitted to a real executor's step log."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from pydantic import Field

from .base import StrictConfig
from .least_squares import fit_linear
from .linear import LinearCostModel


class CalibratedConfig(StrictConfig):
    """`path`: a fit file (`.json`, written by `metroline calibrate`) or a step log CSV to fit
    (metroline's own `--steps-csv`, or any CSV with the `STEP_LOG_COLUMNS`). Block ops are not in
    a log: their costs are given here (seconds per swapped block and per copied block, 0 unless
    set)."""

    path: str
    per_swap_block: float = Field(default=0.0, ge=0.0)
    per_copy_block: float = Field(default=0.0, ge=0.0)


FITTED = ("per_step", "per_prefill_token", "per_decode_token", "per_kv_token")
STEP_LOG_COLUMNS = ("prefill_tokens", "decode_tokens", "duration_s")


class CalibratedCostModel(LinearCostModel):
    """The linear model with `FITTED` coefficients fitted to a real run's step log.

    Build it with `from_steps_csv(path)`. `r2` is the fit's coefficient of determination on the
    log, `num_samples` its number of steps, `source` where it came from.
    """

    name = "calibrated"

    def __init__(self, *, r2: float, num_samples: int, source: str | None = None, **params: Any):
        super().__init__(**params)
        self.r2, self.num_samples, self.source = r2, num_samples, source

    @classmethod
    def from_steps_csv(
        cls, path: str | Path, *, per_swap_block: float = 0.0, per_copy_block: float = 0.0
    ) -> CalibratedCostModel:
        """Fit a CSV with columns `prefill_tokens,decode_tokens,duration_s` and optionally
        `context_tokens` (without it, `per_kv_token` is 0); other columns are ignored.

        Least squares on relative errors (`fit_linear(..., relative=True)`: each step's error
        divided by its duration, so the many short steps weigh as much as the few long ones);
        coefficients are kept at or above 0.
        """
        xs, ys = read_step_log(path)
        coef, r2 = fit_linear(xs, ys, relative=True)
        coef += [0.0] * (len(FITTED) - len(coef))
        return cls(r2=r2, num_samples=len(ys), source=str(path), per_swap_block=per_swap_block,
                   per_copy_block=per_copy_block, **dict(zip(FITTED, coef)))

    @classmethod
    def from_file(
        cls, path: str | Path, *, per_swap_block: float = 0.0, per_copy_block: float = 0.0
    ) -> CalibratedCostModel:
        """A fit file (`.json`: its coefficients as saved, `save`) or a step log (fitted now)."""
        if str(path).lower().endswith(".json"):
            with open(path) as f:
                data = json.load(f)
            try:
                coef = {k: float(data["coefficients"][k]) for k in FITTED}
                r2, num_samples = float(data["r2"]), int(data["num_samples"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: not a calibrated fit file (need coefficients "
                                 f"{', '.join(FITTED)}, r2, num_samples): {e!r}") from None
            return cls(r2=r2, num_samples=num_samples, source=str(path), per_swap_block=per_swap_block,
                       per_copy_block=per_copy_block, **coef)
        return cls.from_steps_csv(path, per_swap_block=per_swap_block, per_copy_block=per_copy_block)

    def coefficients(self) -> dict[str, float]:
        """The fitted coefficients by name (`FITTED`)."""
        return {k: getattr(self.config, k) for k in FITTED}

    def save(self, path: str | Path, **extra: Any) -> None:
        """Write the fit file `from_file` reads back: coefficients, r2, num_samples, and `extra`."""
        doc = {"cost_model": self.name, "coefficients": self.coefficients(), "r2": self.r2,
               "num_samples": self.num_samples, **extra}
        from ...core.results.files import atomic_open

        with atomic_open(path) as f:  # a half-written fit file is never left behind
            json.dump(doc, f, indent=2, allow_nan=False)
            f.write("\n")

    def describe(self) -> dict:
        return {"name": self.name, "source": self.source, "num_samples": self.num_samples,
                "r2": self.r2, **self.config.model_dump()}


def read_step_log(path: str | Path) -> tuple[list[list[float]], list[float]]:
    """Rows `[1, prefill_tokens, decode_tokens(, context_tokens)]` and durations of a step log."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        missing = [c for c in STEP_LOG_COLUMNS if c not in fields]
        if missing:
            raise ValueError(
                f"{path}: missing column(s) {', '.join(missing)}; a step log needs "
                f"{', '.join(STEP_LOG_COLUMNS)} and optionally context_tokens"
            )
        cols = ["prefill_tokens", "decode_tokens"]
        if "context_tokens" in fields:
            cols.append("context_tokens")
        xs, ys = [], []
        for line, row in enumerate(reader, start=2):
            try:
                xs.append([1.0] + [float(row[c]) for c in cols])
                ys.append(float(row["duration_s"]))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line}: {e}") from None
    if not ys:
        raise ValueError(f"{path}: the step log has no rows")
    return xs, ys


def calibrated_cost_model(**params: Any) -> CalibratedCostModel:
    """The `calibrated` entry of `COST_MODELS`: `CalibratedConfig`'s parameters, read from `path`."""
    c = CalibratedConfig(**params)
    return CalibratedCostModel.from_file(c.path, per_swap_block=c.per_swap_block,
                                         per_copy_block=c.per_copy_block)
