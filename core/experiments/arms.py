"""Arms that differ in more than their plugins: each its own policy stack, engine config and cost
model, all run on the same workload draws and compared pair by pair (`compare --arms FILE`,
`compare_arms`).

An arm is an `Arm`: a name, `EngineConfig` fields over the common config (`policy`, `plugins`,
`max_num_seqs`, `num_blocks`, `block_size`, `max_prefill_chunk`, `plugin_options`, ...), and
optionally its own cost model (`cost_model`, `cost_params`; `cost_params = {slowdown = 1.03}`
plants a 3% slower step on any model). An arms file is TOML (or JSON) with one table per arm, in
order, the first the baseline::

    [arms.vllm]
    preset = "vllm"

    [arms.half_slots]
    preset = "vllm"
    max_num_seqs = 128

    [arms.h100]
    preset = "vllm"
    cost_params = { gpu = "H100" }
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..config import EngineConfig
from ..results.horizon import MeasurementWindow
from ..results.min_effect import DEFAULT_CORRECTION


class Arm(BaseModel):
    """One arm of a comparison: `name`, `config` (EngineConfig fields over the common config), and
    its own `cost_model` / `cost_params` (None: the common ones; `cost_params` are laid over the
    common parameters when the model is the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)
    cost_model: str | None = None
    cost_params: dict[str, Any] | None = None

    def engine_config(self, common: EngineConfig) -> EngineConfig:
        """The arm's `EngineConfig`: `common` with the arm's fields (checked: an error names the arm and field)."""
        try:
            return EngineConfig.model_validate({**common.model_dump(exclude_unset=True), **self.config})
        except ValueError as exc:
            raise ValueError(f"arm {self.name!r}: {exc}") from None

    def executor_factory(self, cost_model: str, cost_params: dict[str, Any] | None) -> Callable[[], Any]:
        """A factory of the arm's simulated executor (its cost model, or the common one)."""
        model = self.cost_model or cost_model
        params = dict(cost_params or {}) if model == cost_model else {}
        params.update(self.cost_params or {})
        factory = _SimFactory(model, params)
        try:
            factory()  # a bad cost model or parameter is reported before any run, naming the arm
        except ValueError as exc:
            raise ValueError(f"arm {self.name!r}: cost model: {exc}") from None
        return factory


class _SimFactory:
    """A picklable factory of a simulated executor on a named cost model."""

    def __init__(self, cost_model: str, cost_params: dict[str, Any]) -> None:
        self.cost_model, self.cost_params = cost_model, cost_params

    def __call__(self) -> Any:
        from ...executors.registry import make_executor

        return make_executor("sim", cost_model=self.cost_model, cost_params=dict(self.cost_params))


RUN_KEYS = ("cost_model", "cost_params")
"""The keys of an arm's table that are not `EngineConfig` fields."""


def load_arms(path: str | Path) -> list[Arm]:
    """The arms of an arms file (see the module docstring), in its order: at least two, each name once."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--arms: cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = tomllib.loads(text) if path.suffix != ".json" else json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--arms: {path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None
    tables = doc.get("arms") if isinstance(doc, dict) else None
    if not isinstance(tables, dict) or len(tables) < 2:
        raise ValueError(f"--arms: {path}: give at least two [arms.NAME] tables (the first is the baseline)")
    arms = []
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ValueError(f"--arms: {path}: arms.{name}: must be a table")
        config = {k: v for k, v in table.items() if k not in RUN_KEYS}
        unknown = sorted(set(config) - set(EngineConfig.model_fields))
        if unknown:
            raise ValueError(f"--arms: {path}: arms.{name}.{unknown[0]}: not an engine config field or cost_model/cost_params")
        arms.append(Arm(name=name, config=config, cost_model=table.get("cost_model"), cost_params=table.get("cost_params")))
    return arms


def compare_arms(
    arms: list[Arm], draws: list[Any], seeds: list[int], *, config: EngineConfig | None = None,
    cost_model: str = "roofline", cost_params: dict[str, Any] | None = None, jobs: int | None = None,
    min_effect: dict[str, float] | None = None, correction: str = DEFAULT_CORRECTION,
    measure: MeasurementWindow | None = None,
) -> dict[str, Any]:
    """Run every arm on every workload of `draws` (one per seed of `seeds`, the same draws for
    every arm) and compare them with the first arm, as `compare --seeds` does: `{"runs",
    "comparison"}` (`paired.paired_comparison`, verdicts controlled over the table by
    `correction`: "maxt", "holm" or "none", as `compare --correction`). `measure`: every run's
    measurement window (a warm-up left out, a horizon; `metroline.core.results.horizon`), as
    `compare --warmup/--horizon`."""
    from ..results.paired import paired_comparison
    from .parallel import run_many

    common = config or EngineConfig()
    names = [a.name for a in arms]
    if len(set(names)) != len(names) or len(arms) < 2:
        raise ValueError("arms: give at least two arms, each name once")
    configs = [a.engine_config(common) for a in arms]
    factories = [a.executor_factory(cost_model, cost_params) for a in arms]
    runs = [(w, c) for w in draws for c in configs]
    results = run_many(runs, [f for _ in draws for f in factories], jobs=jobs,
                       labels=[f"{n}#{s}" for s in seeds for n in names], measure=measure)
    docs = [doc for doc, _ in results]
    for i, doc in enumerate(docs):
        doc["arm"] = names[i % len(arms)]
    by_arm = {name: docs[i::len(arms)] for i, name in enumerate(names)}
    return {"runs": docs, "comparison": paired_comparison(by_arm, seeds, names[0], min_effect=min_effect,
                                                                correction=correction)}


def arm_setups(path: str | Path, config: EngineConfig, run: dict[str, Any]) -> tuple[list[str], list[EngineConfig], list[Callable[[], Any]]]:
    """`compare --arms FILE`: each arm's label, config and executor factory, over the command's
    config and run options (a simulated executor: arms with a real model are not supported)."""
    if (run.get("executor") or "sim") != "sim":
        raise ValueError("--arms: each arm runs on the simulator (--executor sim) with its own cost model")
    arms = load_arms(path)
    cost_model = run.get("cost_model", "roofline")
    params = dict(run.get("cost_params") or {})
    if cost_model == "steps" and run.get("step_time") is not None:
        params["step_time"] = run["step_time"]
    return ([a.name for a in arms], [a.engine_config(config) for a in arms],
            [a.executor_factory(cost_model, params) for a in arms])
