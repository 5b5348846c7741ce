"""Does the calibrated simulator predict the real executor? Mean and p90 E2E latency of one
workload run for real (torch executor, wall clock) and simulated on the cost model that
`metroline calibrate` fitted to the same executor (virtual clock), with the same engine config.

The workload is not one the calibration sweep ran: `--workload mixed` is 64 requests (54 of 16
output tokens, 10 of 160) with prompts of 16 to 96 random tokens, arriving as a Poisson stream at
`--rate` requests per second; greedy, EOS off, fcfs. Sampling is one argmax on the logits tensor in
the real run, in the calibration sweep alike (the default sampler has no tensor path before the
vectorised one lands); the simulator's stand-in tokens cost nothing, as the fit assumes.

Run:  python bench/calibrated_vs_real.py [--model smollm2] [--fit cal.json] [--repeats 3]
(with no `--fit`, or a missing file, it calibrates first and writes the fit there)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from metroline.core.plugins.hookspecs import hookimpl

MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000",
              "MALLOC_TOP_PAD_": "536870912"}


class Argmax:
    name = "argmax"

    @hookimpl
    def sample(self, seqs: list, logits: Any) -> list[int]:
        return logits.argmax(dim=-1).tolist()


def workload(vocab: int, rate: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    lengths = [16] * 54 + [160] * 10
    rng.shuffle(lengths)
    t, out = 0.0, []
    for i, n in enumerate(lengths):
        out.append({"request_id": str(i), "arrival_time": t,
                    "prompt_token_ids": [rng.randrange(10, vocab) for _ in range(rng.randint(16, 96))],
                    "sampling": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
        t += rng.expovariate(rate)
    return out


class StepTimes:
    """Wraps an executor: for the plan it runs (`last`), its prefill and decode token counts and
    the step time each of `models` predicts for it."""

    def __init__(self, executor: Any, models: list[Any]) -> None:
        self._executor = executor
        self._models = models
        self.last: tuple[int, int, list[float]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)

    def execute(self, plan: Any) -> Any:
        self.last = (plan.num_prefill_tokens, plan.num_decode_tokens, [m.step_time(plan) for m in self._models])
        return self._executor.execute(plan)


def replay(engine: Any, requests: list[dict], steps: list | None = None) -> list[float]:
    """Submit each request at its arrival on the engine's clock; E2E seconds per request. With
    `steps` (and a `StepTimes` executor), each step's `((prefill, decode, predictions), seconds)` is
    appended to it, the seconds being the whole `Engine.step` on the wall clock, as `calibrate`
    times them."""
    ex, pending = engine.executor, list(requests)
    seqs = []
    while pending or engine.has_unfinished():
        while pending and pending[0]["arrival_time"] <= ex.now():
            r = pending.pop(0)
            engine.add_request(r)
            seqs.append(engine.sequences(r["request_id"])[0])
        if not engine.has_unfinished():
            ex.idle_until(pending[0]["arrival_time"])
            continue
        t0 = time.perf_counter()
        engine.step()
        if steps is not None and ex.last is not None:
            steps.append((ex.last, time.perf_counter() - t0))
            ex.last = None
    return [s.finish_time - s.arrival_time for s in seqs]


def step_errors(steps: list) -> list[tuple[str, int, float, list[float]]]:
    """The real steps of the workload against each fit's prediction for them, by kind of step:
    `(kind, count, real seconds, predicted seconds by fit)` (totals)."""
    kinds: dict[str, list] = {}
    for (prefill, decode, predicted), seconds in steps:
        kind = "decode only" if not prefill else "prefill only" if not decode else "prefill + decode"
        kinds.setdefault(kind, []).append((seconds, predicted))
    return [(kind, len(v), sum(r for r, _ in v), [sum(p[i] for _, p in v) for i in range(len(v[0][1]))])
            for kind, v in sorted(kinds.items())]


def absolute_refit(path: str) -> Any:
    """The fit file's samples fitted again by ordinary (absolute) least squares, as metroline did
    before it fitted relative errors: the comparison this bench prints beside the fit."""
    import json

    from metroline.executors.cost_models import FITTED, CalibratedCostModel, fit_linear

    with open(path) as f:
        samples = json.load(f)["samples"]
    xs = [[1.0, s["prefill_tokens"], s["decode_tokens"], s["context_tokens"]] for s in samples]
    coef, r2 = fit_linear(xs, [s["seconds"] for s in samples])
    return CalibratedCostModel(r2=r2, num_samples=len(samples), source=path, **dict(zip(FITTED, coef)))


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--fit", default="calibrated-smollm2.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=4.0, help="arrivals per second (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared machine more threads spin against other processes)")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})

    import torch

    from metroline.cli import fit_config
    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine
    from metroline.executors.calibrate import calibrate
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.simulated import SimulatedExecutor
    from metroline.executors.torch import TorchExecutor

    torch.set_num_threads(args.threads)
    executor = TorchExecutor.from_options(model=args.model, dtype="float32", device="cpu")
    config = fit_config(EngineConfig(policy="fcfs"), executor, set())
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if not Path(args.fit).is_file():
        calibrate(executor, config, args.fit, repeats=args.repeats, plugins=[Argmax()])
    requests = workload(executor.vocab_size, args.rate, args.seed)
    fits = {"relative (the fit)": make_cost_model("calibrated", path=args.fit),
            "absolute (refit)": absolute_refit(args.fit)}
    steps: list = []
    real = replay(Engine(config, StepTimes(executor, list(fits.values())), plugins=[Argmax()]), requests, steps)
    sims = {name: replay(Engine(config, SimulatedExecutor(model)), requests) for name, model in fits.items()}
    print(f"workload: 64 requests (54 x 16 + 10 x 160 output tokens), prompts 16-96 tokens, "
          f"Poisson {args.rate}/s; fit {args.fit}, least squares on relative errors, and its samples "
          f"refitted on absolute errors for comparison")
    print(f"{'E2E':<6} {'least squares':<20} {'real s':>8} {'simulated s':>12} {'error':>7}")
    for name, f in (("mean", statistics.fmean), ("p90", p90)):
        for fit_name, sim in sims.items():
            r, s = f(real), f(sim)
            print(f"{name:<6} {fit_name:<20} {r:>8.3f} {s:>12.3f} {(s - r) / r:>+7.1%}")
    print("the real run's steps against each fit's prediction for them (whole Engine.step):")
    print(f"{'steps':<18} {'count':>6} {'real s':>8} " + " ".join(f"{n.split()[0] + ' s':>10} {'error':>7}" for n in fits))
    for kind, count, r, ps in step_errors(steps):
        print(f"{kind:<18} {count:>6} {r:>8.3f} " + " ".join(f"{p:>10.3f} {(p - r) / r:>+7.1%}" for p in ps))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
