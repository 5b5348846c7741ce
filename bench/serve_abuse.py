"""Abusive requests against `metroline serve` (a real process on 127.0.0.1, alone or as the front of
`--replicas 2`): how fast each is refused, and how long a concurrent normal stream waited between
two tokens meanwhile, against that stream's own baseline (the same stream with no abuse).

Each abuse is sent while a fresh stream of `--tokens` tokens runs (the server's stand-in tokens on
the simulated executor, `--step-time` seconds a step): a 20 MB body without a key (401), the same
with a key (413: over `max_body_bytes`), a 1 MB text prompt (400: more characters than any prompt
that fits the context, refused before tokenizing), a 100 MB body with a key (413), a body nested
100,000 deep (400), a `response_format` with 5,000 `anyOf` branches (400 at submission), 10,000
stop strings (400); heads of 40 MB and 80 MB (one header, no key) and of 10,000 header fields (431,
refused past 64 KiB or 100 fields), two `Authorization` headers (400), a 400-digit `priority`, a
5,000-digit integer, a lone surrogate and `deadline_s: Infinity` (400 naming the field), a batch of
100,000 prompts (413: more than `max_waiting`); attack 6, the quota: one `n = 64` request reserving
36,800 tokens against a 4,096-token burst (400, too large) and 16 requests at once of about 1,000
tokens each from that tenant (4 admitted from the burst, plus what the bucket refills at 1,000
tokens/s while they arrive; the same on one server and through the front: one bucket);
attack 8, 4 slow readers of another tenant (how long until all were paused, and cancelled after
`stall_timeout`; run it with `--tokens 4000` so the measured stream runs as long as they do). Printed per abuse: the status, the refusal's wall time at the client (which
includes sending the body over loopback), and the stream's max and p99 inter-token gap (read by a
client process of its own).

Run:  python bench/serve_abuse.py [--replicas 2] [--tokens 600] [--step-time 0.005] [--only TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from serve_process import start_serve

import metroline  # noqa: E402

ROOT = Path(metroline.__file__).parent.parent  # the servers import the code this bench imports
KEY = "sk-bench"
QUOTA_KEY, OTHER_KEY = "sk-quota", "sk-other"
BURST = 4096
STALL_S = 5.0
CONFIG = f"""
max_model_len = 4096
[serve]
stall_timeout = {STALL_S}
[serve.tenants.bench]
api_keys = ["{KEY}"]
[serve.tenants.other]
api_keys = ["{OTHER_KEY}"]
[serve.tenants.quota]
api_keys = ["{QUOTA_KEY}"]
[plugin_options.tenant_quota]
token_rate = {{ quota = 1000 }}
burst = {BURST}
"""


def start(replicas: int, step_time: float, folder: Path) -> tuple[subprocess.Popen, str]:
    config = folder / "serve.toml"
    config.write_text(CONFIG)
    flags = ["--replicas", str(replicas)] if replicas > 1 else []
    return start_serve(["--config", str(config), "--cost-model", "steps", "--step-time", str(step_time),
                        "--plugin", "tenant_quota", *flags], str(ROOT), "the server")


def stream_gaps(url: str, tokens: int, out: list[float], started: threading.Event) -> None:
    body = {"prompt": "a steady stream", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    last = None
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.monotonic()
            if last is not None:
                out.append(now - last)
            else:
                started.set()
            last = now


def flood(fields: int, size: int) -> Callable[[str], int]:
    """An abuse that sends a request head of `fields` headers of `size` bytes each over a raw
    socket (no key) and reads the answer's status (0: none, the connection closed)."""
    def send(url: str) -> int:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=120) as s:
            try:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                piece = b"a" * min(size, 1 << 20)  # sent a MiB at a time, as a slow client would
                for i in range(fields):
                    s.sendall(b"X-Flood-%d: " % i)
                    for _ in range(size // len(piece)):
                        s.sendall(piece)
                    s.sendall(b"\r\n")
                s.sendall(b"Content-Length: 2\r\n\r\n{}")
            except OSError:
                pass  # refused and closed mid-head
            answer = b""
            try:
                while len(answer) < 12 and (chunk := s.recv(65536)):
                    answer += chunk
            except OSError:
                pass
        return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else 0

    return send


def quota_burst(parallel: int = 16, each: int = 1000) -> Callable[[str], str]:
    """Attack 6, the quota across replicas: tenant `quota` (1,000 tokens/s, a burst of `BURST`)
    sends `parallel` requests at once, each reserving about `each` tokens; the answer is how many
    were admitted (200) and refused (429). One bucket for the tenant, on one server or at the front
    of several replicas, admits BURST // each of them (4) plus what it refills (1,000 tokens/s)
    while they arrive, not that many per replica."""
    def send(url: str) -> str:
        body = {"prompt": "q", "max_tokens": each - 1}
        headers = {"Authorization": f"Bearer {QUOTA_KEY}"}

        def one(out: list[int]) -> None:
            out.append(httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120).status_code)

        statuses: list[int] = []
        threads = [threading.Thread(target=one, args=(statuses,)) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return f"{statuses.count(200)}x200 {statuses.count(429)}x429 " + (
            f"+{len(statuses) - statuses.count(200) - statuses.count(429)} other" if len(set(statuses) - {200, 429}) else "")

    return send


def slow_readers(count: int = 4, tokens: int = 4000) -> Callable[[str], str]:
    """Attack 8, slow readers: `count` streams of tenant `other` (`tokens` tokens each, about
    `tokens` x 180 bytes of SSE) whose clients read nothing, each on a socket with a 4 KiB
    receive buffer. The answer: how long until the server had paused all of them (`paused` on
    `/health`, polled every 20 ms: a stream is paused once its socket holds `buffer_bytes`, 256
    KiB), and whether they were all cut after `stall_timeout` (`paused` back to 0). The
    concurrent stream of tenant `bench` runs meanwhile (its gaps are the table's)."""
    def send(url: str) -> str:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"prompt": "slow", "max_tokens": tokens, "stream": True, "ignore_eos": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OTHER_KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        socks = []
        t0 = time.monotonic()
        for _ in range(count):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((host, int(port)))
            s.sendall(head + body)
            socks.append(s)
        paused_in = cancelled_in = None
        most = 0
        h: dict = {}
        try:
            while time.monotonic() - t0 < STALL_S + 115:
                h = httpx.get(url + "/health", timeout=10).json()
                now = time.monotonic() - t0
                most = max(most, h.get("paused", 0))
                if paused_in is None and h.get("paused", 0) >= count:
                    paused_in = now
                if paused_in is not None and h.get("paused", 1) == 0:  # cut (`in_flight` counts the measured stream)
                    cancelled_in = now
                    break
                time.sleep(0.02)
        finally:
            for s in socks:
                s.close()
        if "paused" not in h:
            return "no pause figures on /health (a front)"
        paused = f"{count} paused in {paused_in:.1f} s" if paused_in is not None else f"at most {most} of {count} paused"
        gone = f", all cut {cancelled_in:.1f} s in" if cancelled_in is not None else ", not cut"
        return paused + gone + f" (socket_pauses {h.get('socket_pauses')})"

    return send


def abuses() -> list[tuple[str, Any, bytes]]:
    key = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    plain = {"content-type": "application/json"}
    twice = [("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer sk-other"),
             ("content-type", "application/json")]
    anyof = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "string"}}} for i in range(5000)]}
    return [
        ("20 MB body, no key", plain, json.dumps({"prompt": "x" * (20 << 20)}).encode()),
        ("20 MB body, a key", key, json.dumps({"prompt": "x" * (20 << 20)}).encode()),
        ("1 MB text prompt", key, json.dumps({"prompt": "y" * (1 << 20)}).encode()),
        ("100 MB body, a key", key, b'{"prompt": "' + b"z" * (100 << 20) + b'"}'),
        ("body nested 100k deep", key, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("anyOf of 5,000 schemas", key, json.dumps({"prompt": "hi", "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": anyof}}}).encode()),
        ("10,000 stop strings", key, json.dumps({"prompt": "hi", "stop": [f"s{i}" for i in range(10_000)]}).encode()),
        ("40 MB header, no key", flood(1, 40 << 20), b""),
        ("80 MB header, no key", flood(1, 80 << 20), b""),
        ("10,000 header fields", flood(10_000, 8), b""),
        ("two Authorization", twice, json.dumps({"prompt": "hi", "max_tokens": 2}).encode()),
        ("400-digit priority", key, b'{"prompt": "hi", "max_tokens": 2, "priority": ' + b"9" * 400 + b"}"),
        ("5,000-digit integer", key, b'{"prompt": "hi", "seed": ' + b"7" * 5000 + b"}"),
        ("a lone surrogate", key, b'{"prompt": "a \\ud800 b", "max_tokens": 2}'),
        ("deadline_s Infinity", key, b'{"prompt": "hi", "max_tokens": 2, "deadline_s": Infinity}'),
        ("batch of 100,000", key, json.dumps({"prompt": [f"p{i}" for i in range(100_000)], "max_tokens": 2}).encode()),
        ("n=64 over the burst", {"Authorization": f"Bearer {QUOTA_KEY}", "content-type": "application/json"},
         json.dumps({"prompt": "hi", "max_tokens": 575, "n": 64}).encode()),
        ("16 at once, quota 4", quota_burst(), b""),
        ("4 slow readers", slow_readers(), b""),
    ]


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else float("nan")


def measured(url: str, tokens: int, abuse: tuple[str, dict, bytes] | None) -> tuple[list[float], int | str, float]:
    """(the concurrent stream's gaps, the abuse's status (or, for some, what happened), its wall
    time). The stream is read by a process of its own, so that sending the abuse does not hold its
    interpreter lock."""
    reader = subprocess.Popen([sys.executable, __file__, "--reader", url, "--tokens", str(tokens)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert reader.stdout is not None and reader.stdout.readline().strip() == "started"
    time.sleep(0.2)
    status: int | str = 0
    took = 0.0
    if abuse is not None:
        _, headers, body = abuse
        t0 = time.monotonic()
        if callable(headers):  # a raw-socket abuse
            status = headers(url)
        else:
            status = httpx.post(url + "/v1/completions", content=body, headers=headers, timeout=120).status_code
        took = time.monotonic() - t0
    gaps = json.loads(reader.stdout.read())
    reader.wait(30)
    return gaps, status, took


def read_stream(url: str, tokens: int) -> None:
    gaps: list[float] = []
    started = threading.Event()
    t = threading.Thread(target=stream_gaps, args=(url, tokens, gaps, started), daemon=True)
    t.start()
    started.wait(30)
    print("started", flush=True)
    t.join(120)
    print(json.dumps(gaps), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--step-time", type=float, default=0.005)
    ap.add_argument("--only", metavar="TEXT", help="run only the abuses whose name holds TEXT")
    ap.add_argument("--reader", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        return read_stream(args.reader, args.tokens)
    with tempfile.TemporaryDirectory() as folder:
        proc, url = start(args.replicas, args.step_time, Path(folder))
        try:
            base, _, _ = measured(url, args.tokens, None)
            where = "the front of --replicas %d" % args.replicas if args.replicas > 1 else "one server"
            print(f"{where}; a concurrent stream of {args.tokens} tokens, {args.step_time * 1e3:g} ms a step")
            print(f"  {'abuse':<24} {'status':>6} {'refused in':>11} {'max gap':>9} {'p99 gap':>9}")
            print(f"  {'(none: baseline)':<24} {'':>6} {'':>11} {max(base) * 1e3:7.1f}ms {p99(base) * 1e3:7.1f}ms")
            for abuse in abuses():
                if args.only and args.only not in abuse[0]:
                    continue
                gaps, status, took = measured(url, args.tokens, abuse)
                line = (f"  {abuse[0]:<24} {{}} {took * 1e3:9.1f}ms {max(gaps) * 1e3:7.1f}ms "
                        f"{p99(gaps) * 1e3:7.1f}ms")
                print(line.format(f"{status:>6}") if isinstance(status, int) else line.format(f"{'':>6}") + f"  {status}")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


if __name__ == "__main__":
    main()
