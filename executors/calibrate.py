"""`metroline calibrate`: time a real executor over a sweep of batch shapes and fit the simulator's
`calibrated` cost model to it.

Each shape is a batch of `batch` requests with random prompts of `context` tokens run through an
engine on the executor: their prefill steps (chunked by the token budget) and then `decode_steps`
decode steps of the whole batch. Every step is a sample `(prefill tokens, decode tokens, context
tokens, seconds)`, where the seconds are the whole `Engine.step` on the wall clock (scheduling,
block ops, the forward and sampling: what the simulated clock stands for). Each shape runs
`repeats` times and each of its steps keeps the median, which sheds the outliers of a shared
machine. The fit is `CalibratedCostModel`'s least squares; the fit file is JSON.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..core.config import EngineConfig
from ..core.step.engine import Engine
from .cost_models import FITTED, CalibratedCostModel, fit_linear

FULL_SWEEP = (
    (1, 16), (1, 128), (1, 512), (4, 256), (8, 32), (8, 384), (16, 128), (32, 32), (32, 128),
    (64, 16), (64, 64),
)
"""(batch, context) shapes of the default sweep: decode batches of 1 to 64 sequences over contexts
of 16 to 512 tokens, and prefill steps of 16 to the full token budget (2048 by default)."""
QUICK_SWEEP = ((1, 16), (1, 96), (4, 48), (8, 16), (16, 40))
"""A small sweep for a first look (and the tests)."""

Sample = tuple[int, int, int, float]
"""One timed step: `(prefill_tokens, decode_tokens, context_tokens, seconds)`."""


class _Recording:
    """Wraps an executor and remembers the token counts of the last plan it ran."""

    def __init__(self, executor: Any) -> None:
        self._executor = executor
        self.last: tuple[int, int, int] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)

    def execute(self, plan: Any) -> Any:
        self.last = (plan.num_prefill_tokens, plan.num_decode_tokens, plan.num_context_tokens)
        return self._executor.execute(plan)


def _run_shape(engine: Engine, rec: _Recording, batch: int, context: int, decode_steps: int,
               vocab: int, rng: random.Random, tag: str) -> list[tuple[tuple[int, int, int], float]]:
    for i in range(batch):
        engine.add_request({
            "request_id": f"{tag}-{i}", "prompt_token_ids": [rng.randrange(vocab) for _ in range(context)],
            "sampling": {"max_new_tokens": decode_steps + 1, "temperature": 0.0, "ignore_eos": True},
        })
    steps = []
    while engine.has_unfinished():
        rec.last = None
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        if rec.last is not None and (rec.last[0] or rec.last[1]):
            steps.append((rec.last, dt))
    return steps


def measure(
    executor: Any, config: EngineConfig, shapes: Iterable[tuple[int, int]], *, decode_steps: int = 4,
    repeats: int = 3, plugins: Iterable[Any] = (), seed: int = 0, log: Callable[[str], None] | None = None,
) -> list[tuple[tuple[int, int], Sample]]:
    """Run each `(batch, context)` shape `repeats` times (after one warm-up run) on an engine over
    `executor`; returns `((batch, context), sample)` per step of each shape, the seconds being the
    median over the repeats. Prefix caching is off so that repeats recompute their prompts."""
    config = config.model_copy(update={"enable_prefix_caching": False})
    rec = _Recording(executor)
    engine = Engine(config, rec, plugins=list(plugins))
    vocab = getattr(executor, "vocab_size", None) or 32000
    out: list[tuple[tuple[int, int], Sample]] = []
    shapes = list(shapes)
    for k, (batch, context) in enumerate(shapes):
        if batch > config.max_num_seqs or batch * (context + decode_steps + 1) > config.max_kv_tokens:
            raise ValueError(f"calibration shape batch={batch} x context={context} does not fit the pool "
                             f"({config.max_kv_tokens} tokens, max_num_seqs={config.max_num_seqs})")
        runs = []
        for r in range(repeats + (1 if k == 0 else 0)):  # the very first run warms up
            rng = random.Random(seed * 7919 + k)  # the same prompts every repeat: the same plans
            runs.append(_run_shape(engine, rec, batch, context, decode_steps, vocab, rng, f"{k}.{r}"))
        runs = runs[-repeats:]
        plans = [p for p, _ in runs[0]]
        if any([p for p, _ in run] != plans for run in runs):
            raise RuntimeError(f"calibration shape {batch}x{context}: repeats were scheduled differently")
        for i, plan in enumerate(plans):
            out.append(((batch, context), (*plan, statistics.median(run[i][1] for run in runs))))
        if log is not None:
            steps = [s for shape, s in out if shape == (batch, context)]
            log(f"  batch {batch:>3} x context {context:>4}: {len(steps)} steps, "
                f"{sum(s[3] for s in steps):.3f} s")
    engine.close()
    return out


def fit(samples: list[Sample], source: str | None = None) -> CalibratedCostModel:
    """The calibrated cost model fitted to `samples`: least squares on relative errors (see
    `fit_linear`), since a workload's time is mostly many short steps that an absolute fit, led by
    the few long prefill steps, mispredicts by several percent."""
    xs = [[1.0, float(p), float(d), float(c)] for p, d, c, _ in samples]
    coef, r2 = fit_linear(xs, [s[3] for s in samples], relative=True)
    return CalibratedCostModel(r2=r2, num_samples=len(samples), source=source, **dict(zip(FITTED, coef)))


def predict(model: CalibratedCostModel, sample: Sample) -> float:
    """The model's seconds for a sample's token counts (no block ops)."""
    c = model.coefficients()
    p, d, ctx, _ = sample
    return c["per_step"] + c["per_prefill_token"] * p + c["per_decode_token"] * d + c["per_kv_token"] * ctx


def fit_errors(model: CalibratedCostModel, samples: list[Sample]) -> dict[str, float]:
    """Relative errors of the model on `samples`: per step (mean and max of |pred - real| / real)
    and over their total time."""
    rel = [abs(predict(model, s) - s[3]) / s[3] for s in samples]
    total = sum(s[3] for s in samples)
    return {"mean_step_error": statistics.fmean(rel), "max_step_error": max(rel),
            "total_time_error": abs(sum(predict(model, s) for s in samples) - total) / total}


def calibrate(
    executor: Any, config: EngineConfig, out: str | Path, *, repeats: int = 3, quick: bool = False,
    shapes: Iterable[tuple[int, int]] | None = None, decode_steps: int = 4, plugins: Iterable[Any] = (),
    log: Callable[[str], None] = print,
) -> CalibratedCostModel:
    """Measure the sweep, fit, save the fit file at `out` (coefficients, fit errors and the samples)
    and print the fit error per shape; returns the fitted model."""
    shapes = list(shapes if shapes is not None else QUICK_SWEEP if quick else FULL_SWEEP)
    log(f"calibrating {getattr(executor, 'name', '?')} ({describe_source(executor)}) on {len(shapes)} "
        f"batch shapes x {repeats} repeats")
    timed = measure(executor, config, shapes, decode_steps=decode_steps, repeats=repeats, plugins=plugins, log=log)
    samples = [s for _, s in timed]
    model = fit(samples, source=str(out))
    errors = fit_errors(model, samples)
    log(f"{'batch x context':>16} {'steps':>5} {'measured s':>10} {'predicted s':>11} {'error':>7}")
    for shape in dict.fromkeys(shape for shape, _ in timed):
        mine = [s for sh, s in timed if sh == shape]
        real = sum(s[3] for s in mine)
        pred = sum(predict(model, s) for s in mine)
        log(f"{shape[0]:>7} x {shape[1]:<6} {len(mine):>5} {real:>10.4f} {pred:>11.4f} {(pred - real) / real:>+7.1%}")
    coef = model.coefficients()
    log("fit: " + ", ".join(f"{k} {v:.3g}" for k, v in coef.items()) + f"; R2 {model.r2:.4f}")
    log(f"fit error: mean {errors['mean_step_error']:.1%} per step (max {errors['max_step_error']:.1%}), "
        f"{errors['total_time_error']:.1%} on the total")
    model.save(out, executor=_describe(executor), fit_error=errors,
               samples=[{"batch": sh[0], "context": sh[1], "prefill_tokens": s[0], "decode_tokens": s[1],
                         "context_tokens": s[2], "seconds": s[3]} for sh, s in timed])
    log(f"saved {out}: use --cost-model calibrated --cost-param path={out}")
    return model


def describe_source(executor: Any) -> str:
    d = _describe(executor)
    return ", ".join(str(d[k]) for k in ("model", "device", "dtype") if d.get(k) is not None) or "?"


def _describe(executor: Any) -> dict:
    d = executor.describe() if hasattr(executor, "describe") else {}
    return {k: d.get(k) for k in ("name", "model", "device", "dtype", "attention")}
