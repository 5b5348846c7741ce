"""The suite's runs of a plugin on the engine: each workload in each preemption mode with every
check (`checks`), the first one twice (deterministic results), and each workload again on the
stack without the plugin, to count the requests that ran differently (`metroline.testing`)."""

from __future__ import annotations

from typing import Any

from ..workloads.build import Workload
from .checks import check_calls, check_drained, fingerprint, run_once


def run_all(
    report: Any, workload_list: list[Workload], modes: tuple[str, ...], name: str, setup: Any,
    seed: int, failures: list[str],
) -> dict[str, Any]:
    """Each workload in each mode (the first workload twice: the results must be identical);
    returns each workload's fingerprint in the first mode."""
    fingerprints = {}
    for wi, wl in enumerate(workload_list):
        for mode in modes:
            label = f"{name} on {wl.name} ({mode})"
            cfg, extra = setup(mode)
            try:
                doc, engine, calls = run_once(wl, cfg, extra, failures, report.coverage)
            except Exception as exc:  # a PluginError, a stuck engine, a crash: all are failures
                failures.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            check_drained(engine, label, failures)
            check_calls(calls, cfg, label, failures)
            if mode == modes[0]:
                fingerprints[wl.name] = fingerprint(engine)
            if wi == 0:
                cfg2, extra2 = setup(mode)
                try:
                    _, again, _ = run_once(wl, cfg2, extra2, [])
                    if fingerprint(again) != fingerprint(engine):
                        failures.append(f"{label}: two runs with seed {seed} gave different results")
                except Exception as exc:
                    failures.append(f"{label}: second run: {type(exc).__name__}: {exc}")
            s = doc["summary"]
            report.runs.append({
                "workload": wl.name, "mode": mode, "requests": s["requests"], "steps": s["steps"],
                "preemptions": s["preemptions"],
            })
    return fingerprints


def compare_without(report: Any, workload_list: list[Workload], mode: str, setup: Any,
                     fingerprints: dict[str, Any], base: str, failures: list[str]) -> None:
    """Run each workload on the stack without the plugin (`base` alone) and count the requests
    whose record (times, tokens, preemptions, outcome) differs."""
    for wl in workload_list:
        if wl.name not in fingerprints:
            continue
        cfg, _ = setup(mode, with_plugin=False)
        try:
            _, engine, _ = run_once(wl, cfg, [], [])
        except Exception as exc:
            failures.append(f"{base} alone on {wl.name} ({mode}): {type(exc).__name__}: {exc}")
            continue
        mine = {r[0]: r for r in fingerprints[wl.name][0]}
        theirs = {r[0]: r for r in fingerprint(engine)[0]}
        differ = sum(mine.get(k) != theirs.get(k) for k in set(mine) | set(theirs))
        report.without.append({"workload": wl.name, "mode": mode, "differ": differ, "requests": len(mine),
                               "stack": base})
