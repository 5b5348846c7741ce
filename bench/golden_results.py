"""Record or check the result documents of the documentation's simulated runs (docs/guide/).

A refactoring commit must change no simulated result. This script runs a fixed
set of the documented runs (each policy, preemption by recompute and by swap, prefix
sharing, the contrib plugins, the vllm preset, a trace) and writes, for each,
its JSON result document and its per-request CSV with the wall-clock fields
removed. ``--check DIR`` runs them again and reports every difference.

    python bench/golden_results.py --record /tmp/golden      # before the change
    python bench/golden_results.py --check /tmp/golden       # after it

Integers and strings must be equal; floats must agree to a relative 1e-9 (a
percentile computed by a library instead of by hand may differ in its last bit,
a schedule that changed differs far more). Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS: dict[str, list[str]] = {
    "chat-fcfs": ["run", "--workload", "chat", "--max-requests", "1500"],
    "chat-srpt": ["run", "--workload", "chat", "--max-requests", "1500", "--policy", "srpt"],
    "chat-priority": ["run", "--workload", "chat", "--max-requests", "1500", "--policy", "priority"],
    "chat-wfq": ["run", "--workload", "chat", "--max-requests", "1500", "--policy", "weighted_fair"],
    "chat-rr": ["run", "--workload", "chat", "--max-requests", "1500", "--policy", "token_rr"],
    "mixed-static": ["run", "--workload", "mixed-64", "--policy", "static", "--max-num-seqs", "64"],
    "shared-prefix": ["run", "--workload", "shared-prefix"],
    "shared-prefix-token": ["run", "--workload", "shared-prefix", "--config", "{prefix_token}"],
    "tight-recompute": ["run", "--workload", "chat", "--max-requests", "800", "--num-blocks", "400",
                        "--policy", "priority"],
    "tight-swap": ["run", "--workload", "chat", "--max-requests", "800", "--num-blocks", "400",
                   "--preemption", "swap", "--swap-space-blocks", "2000", "--policy", "srpt"],
    "tight-vllm": ["run", "--workload", "chat", "--max-requests", "800", "--num-blocks", "400",
                   "--preset", "vllm"],
    "azure-srpt": ["run", "--workload", "azure-conv", "--max-requests", "1500", "--rate-scale", "2.844565",
                   "--max-num-seqs", "32", "--policy", "srpt", "--oracle-lengths"],
    "quota": ["run", "--policy", "fcfs", "--plugin", "tenant_quota", "--config", "examples/quota.toml"],
    "prefix-aware": ["run", "--policy", "prefix_aware", "--plugin", "tenant_quota", "--config",
                     "examples/prefix.toml"],
    "slo": ["run", "--policy", "fcfs", "--plugin", "prefill_first", "--plugin", "slo_classes",
            "--config", "examples/slo.toml"],
    "reserve": ["run", "--policy", "srpt", "--plugin", "decode_first", "--plugin", "reserve",
                "--workload", "azure-conv", "--max-requests", "1000"],
    # the efficiencies roofline had when the documents were recorded (its defaults since: 0.65, 0.7)
    "roofline": ["run", "--workload", "chat", "--max-requests", "800", "--cost-model", "roofline",
                 "--num-blocks", "600", "--cost-param", "flops_efficiency=0.6",
                 "--cost-param", "bandwidth_efficiency=0.8"],
}

WALL_KEYS = {"wall_s", "manifest", "started_at", "host"}


def _strip(doc):
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in WALL_KEYS}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def _run(name: str, argv: list[str], out: Path, tmp: Path) -> None:
    prefix_token = tmp / "prefix_token.toml"
    prefix_token.write_text('prefix_match = "token"\n')
    argv = [a.replace("{prefix_token}", str(prefix_token)) for a in argv]
    js, rq = tmp / f"{name}.json", tmp / f"{name}.csv"
    if "--cost-model" not in argv:  # pinned, so a change of the default cost model is not a diff
        argv = [*argv, "--cost-model", "steps"]
    cmd = [sys.executable, "-m", "metroline", *argv, "--json", str(js), "--requests-csv", str(rq), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name}: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    doc = _strip(json.loads(js.read_text()))
    with rq.open() as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["id"])
    (out / f"{name}.json").write_text(json.dumps({"result": doc, "requests": rows}, indent=1, sort_keys=True))


def _diff(a, b, path: str, out: list[str]) -> None:
    if len(out) > 20:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'before' if k in a else 'after'}")
            else:
                _diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items before, {len(b)} after")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{path}[{i}]", out)
    elif isinstance(a, str) and isinstance(b, str) and a != b:
        try:
            fa, fb = float(a), float(b)
        except ValueError:
            out.append(f"{path}: {a!r} -> {b!r}")
            return
        if not math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-12):
            out.append(f"{path}: {a!r} -> {b!r}")
    elif isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)):
            out.append(f"{path}: {a!r} -> {b!r}")
    elif a != b:
        out.append(f"{path}: {a!r} -> {b!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", metavar="DIR", type=Path)
    group.add_argument("--check", metavar="DIR", type=Path)
    ap.add_argument("--only", help="comma-separated run names")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(RUNS)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        out = args.record or tmp / "now"
        out.mkdir(parents=True, exist_ok=True)
        for name in names:
            _run(name, RUNS[name], out, tmp)
            print(f"ran {name}", file=sys.stderr)
        if args.record:
            print(f"recorded {len(names)} runs in {out}")
            return 0
        bad = 0
        for name in names:
            before = json.loads((args.check / f"{name}.json").read_text())
            after = json.loads((out / f"{name}.json").read_text())
            diffs: list[str] = []
            _diff(before, after, name, diffs)
            if diffs:
                bad += 1
                print(f"{name}: DIFFERENT\n  " + "\n  ".join(diffs[:20]))
            else:
                print(f"{name}: identical")
        print(f"{len(names) - bad} of {len(names)} runs identical")
        return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
