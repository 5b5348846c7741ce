"""How long a process waits to run after a message wakes it, when the process that sent it stays
busy: the effect `bench/serve_load.py` avoids by pinning the server and its clients to separate
CPUs.

Two processes ping-pong over a socket pair. The sender sends a byte, then stays busy for `--busy`
seconds (as a server goes on writing other streams and stepping the engine); the receiver stamps
the time it got the byte and sends the stamp back. Printed: the wake latency (stamp minus send
time) percentiles, with both processes free to run on any CPU and pinned to two different CPUs.
On a machine where the scheduler sometimes places the woken receiver on the sender's busy CPU, the
unpinned tail reaches the busy time.

    python bench/wake_latency.py [--busy 0.001] [--gap 0.005] [--rounds 300]
"""

from __future__ import annotations

import argparse
import os
import socket
import time


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def ping_pong(rounds: int, gap: float, busy: float, pin: bool) -> list[float]:
    """Wake latencies (seconds) of `rounds` messages."""
    a, b = socket.socketpair()
    cpus = sorted(os.sched_getaffinity(0))
    pid = os.fork()
    if pin:
        os.sched_setaffinity(0, {cpus[0] if pid else cpus[1]})
    if pid == 0:  # the receiver
        try:
            for _ in range(rounds):
                b.recv(16)
                b.send(repr(time.monotonic()).encode())
        finally:
            os._exit(0)
    latencies = []
    for _ in range(rounds):
        time.sleep(gap)
        sent = time.monotonic()
        a.send(b"x")
        while time.monotonic() < sent + busy:
            pass
        latencies.append(float(a.recv(64)) - sent)
    os.waitpid(pid, 0)
    return latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=float, default=0.001, help="seconds the sender stays busy after sending")
    ap.add_argument("--gap", type=float, default=0.005, help="seconds both sleep between rounds")
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs and CPU affinity (Linux)")
    for pin in (False, True):
        lat = ping_pong(args.rounds, args.gap, args.busy, pin)
        print(f"{'pinned to two CPUs' if pin else 'free to run anywhere':<22} wake latency us: "
              + "  ".join(f"p{q} {1e6 * pct(lat, q):6.0f}" for q in (50, 90, 99))
              + f"  max {1e6 * max(lat):6.0f}  (sender busy {1e3 * args.busy:g} ms)")


if __name__ == "__main__":
    main()
