"""What an engine's KV holds after every request ended: one rule for the conformance suite's drain
check (`checks.check_drained`) and the KV shadow's (`KVShadow.check_drained`)."""

from __future__ import annotations

from typing import Any


def kv_leaks(engine: Any) -> list[str]:
    """Each way `engine`'s KV is not drained: a broken pool invariant, device blocks still
    referenced, host (swap) blocks still allocated. Empty when every block is back."""
    found = []
    pool = engine.pool
    try:
        pool.check_invariants([])
    except AssertionError as exc:
        found.append(f"KV pool invariant: {exc}")
    if pool.num_used_blocks():
        found.append(f"{pool.num_used_blocks()} device blocks leaked (still referenced)")
    swap = engine.scheduler.swap
    if swap is not None and swap.num_free_blocks() != swap.num_blocks:
        found.append(f"{swap.num_blocks - swap.num_free_blocks()} host blocks leaked")
    return found
