"""A `metroline serve` child process for the serving benches (`serve_load.py --front`,
`front_concurrency.py`, `serve_abuse.py`): started on a free port of 127.0.0.1, returned once its
`/health` answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def start_serve(flags: list[str], pythonpath: str, what: str = "metroline serve") -> tuple[subprocess.Popen, str]:
    """(process, url) of `python -m metroline serve FLAGS --port P` with `pythonpath` (the folder
    that holds the `metroline` package), once it answers `/health` (within 120 s, else it is
    killed and the bench exits saying `what` did not start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "metroline", "serve", *flags, "--port", str(port)],
                            env={**os.environ, "PYTHONPATH": pythonpath})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{what} did not start")
