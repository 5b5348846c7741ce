"""How many CPU threads the torch executor computes with: `--threads N`, or a default that fits
the machine.

torch's own default is one thread per core of the machine, whatever the process may run on and
whatever else runs there; on a shared or pinned machine those threads spin against each other and
the neighbours (SmolLM2 at load average 10 on 2 cores: 8 s a token with torch's default, 0.5 s
with one thread). The default here is the cores this process may run on (`os.sched_getaffinity`:
`taskset`, cgroup cpusets), fewer when the machine is busy (its cores minus the one-minute load
average, rounded down, at least 1), and never more than `OMP_NUM_THREADS` when that is set. A
thread count over the cores the process may use is allowed when asked for, with a warning.
"""

from __future__ import annotations

import os
import warnings

import torch

MAX_THREADS = 4096
"""The largest `--threads` accepted."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; all of the machine's where the
    platform has no affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def free_cores() -> int:
    """The machine's cores minus its one-minute load average, rounded down; at least 1 (all of
    them where the platform has no load average)."""
    total = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return total
    return max(1, int(total - load))


def omp_threads() -> int | None:
    """`OMP_NUM_THREADS` when it is a positive integer, else None."""
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def default_threads() -> int:
    """The thread count without `--threads`: usable cores, at most the free ones and at most
    `OMP_NUM_THREADS` (see the module docstring); at least 1."""
    n = min(usable_cores(), free_cores())
    omp = omp_threads()
    if omp is not None:
        n = min(n, omp)
    return max(1, n)


def resolve(threads: int | None) -> int:
    """The thread count to run with: `threads` when given (a one-line error unless 1..MAX_THREADS;
    a warning when it is more than the usable cores), else `default_threads()`."""
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"--threads {threads!r}: an integer from 1 to {MAX_THREADS}")
    cores = usable_cores()
    if threads > cores:
        warnings.warn(f"--threads {threads}: more than the {cores} core(s) this process may run on; "
                      "the threads will oversubscribe them", RuntimeWarning, stacklevel=2)
    return threads


def apply(threads: int | None) -> int:
    """Set torch's intra-op thread count to `resolve(threads)`; returns it."""
    n = resolve(threads)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
