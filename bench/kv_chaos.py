"""KV chaos: N random engine configurations and workloads, every step checked by the KV shadow.

Each configuration is drawn from `metroline.core.conformance.kv_chaos.draw_scenario` (block sizes
1-64, pools that just hold the largest request, swap and recompute, prefix caching by block and
by token, every shipped policy with up to three stacked plugins, `n > 1`, aborts, n-gram
speculation, the vLLM preset) with seed `--seed + i`, and run on the simulated executor under
`metroline.core.conformance.kv_shadow.KVShadow`: every slot a step reads must hold exactly the
reading sequence's own prefix, every swapped-out copy the sequence's KV, no block (device or host)
may leak, and every request must finish.

For each failure it prints the seed, the first error, a shrunk reproducer (fewer requests,
plugins and tokens, still failing the same way) as one line of summary and one line of JSON,
which `--replay JSON` runs again. At the end: how many configurations ran clean, and the wall
time.

Run:  python bench/kv_chaos.py --configs 2000 --seed 0
      python bench/kv_chaos.py --replay '{"config": ..., "requests": ..., "aborts": ...}'
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from metroline.core.conformance.kv_chaos import RandomDraw, Scenario, draw_scenario, run_scenario, shrink


def report_failure(seed: int | None, scenario: Scenario, errors: list[str], kind: str, minimize: bool) -> None:
    label = f"seed {seed}" if seed is not None else "replay"
    print(f"FAIL {label}: {errors[0]}")
    if minimize:
        small = shrink(scenario, lambda s: run_scenario(s).kind == kind)
        out = run_scenario(small)
        print(f"  shrunk: {small.summary()}")
        print(f"  first error: {out.errors[0] if out.errors else '(none)'}")
        print(f"  replay: {small.to_json()}")
    else:
        print(f"  scenario: {scenario.summary()}")
        print(f"  replay: {scenario.to_json()}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=2000, help="random configurations to run (default 2000)")
    ap.add_argument("--seed", type=int, default=0, help="the first configuration's seed (default 0)")
    ap.add_argument("--no-shrink", action="store_true", help="print failing scenarios as drawn, without shrinking")
    ap.add_argument("--max-failures", type=int, default=5, help="stop after this many failures (default 5)")
    ap.add_argument("--replay", metavar="JSON", help="run one scenario (a 'replay:' line) and print its errors")
    args = ap.parse_args(argv)

    if args.replay:
        scenario = Scenario.from_json(args.replay)
        out = run_scenario(scenario)
        print(scenario.summary())
        for e in out.errors:
            print(f"  {e}")
        print("clean" if not out.errors else f"{len(out.errors)} errors")
        return 1 if out.errors else 0

    start = time.perf_counter()
    clean = failed = 0
    totals: Counter = Counter()
    kinds: Counter = Counter()
    for i in range(args.configs):
        seed = args.seed + i
        scenario = draw_scenario(RandomDraw(seed))
        out = run_scenario(scenario)
        totals.update(steps=out.steps, reads=out.reads, preemptions=out.preemptions, swap_outs=out.swap_outs)
        if not out.errors:
            clean += 1
            continue
        failed += 1
        kinds[out.kind] += 1
        report_failure(seed, scenario, out.errors, out.kind, not args.no_shrink)
        if failed >= args.max_failures:
            print(f"stopping after {failed} failures")
            break
    ran = clean + failed
    wall = time.perf_counter() - start
    print(f"{clean} of {ran} configurations clean (seeds {args.seed}..{args.seed + ran - 1}); "
          f"{totals['steps']} steps, {totals['reads']} slot reads checked, {totals['preemptions']} preemptions, "
          f"{totals['swap_outs']} block swap-outs")
    if kinds:
        print("failures by kind: " + ", ".join(f"{k}: {n}" for k, n in kinds.most_common()))
    print(f"wall time {wall:.1f} s")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
