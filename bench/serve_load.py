"""Load test of `metroline serve` on the simulated executor in real time, over loopback HTTP.

The server runs in this process (127.0.0.1, an ephemeral port); the clients run in a child process
(so that they do not share the server's interpreter lock): streaming chat completions arriving as a
Poisson process at `--rate` per second for `--duration` seconds, at most `--max-clients` in flight
(an arrival past that is counted as `dropped`), tenants drawn at random, `--disconnect` of them
hanging up after a few tokens. Prints client-side TTFT and inter-token latency percentiles,
per-tenant throughput, the 429 count, and the server's own overhead: for each request, its TTFT as
the client saw it minus its TTFT inside the engine (first token time - arrival, on the wall clock),
i.e. HTTP, JSON, SSE and the engine loop's hand-offs, and its breakdown from time stamps taken at
each hand-off (one monotonic clock for both processes):

    client -> handler    the client's connect and send, uvicorn's accept and parse, routing
    handler -> engine    the body parsed and validated, the prompt tokenised, the request stamped
                         as arrived (the engine's TTFT starts here: the wait for the step in
                         flight to end before the request joins the engine counts in the engine's
                         TTFT, not in the overhead)
    token -> written     the step's modeled end to the first SSE bytes handed to the socket: the
                         event loop waking at that end (its timers are about 1 ms coarse, and a
                         loaded machine wakes it later), handing the tokens out, the handler
    written -> client    loopback and the client process reading and parsing them
    inside the app       handler -> engine plus token -> written: the part spent in the app's own
                         code and event loop, without the kernel, uvicorn's accept and the client

`--weights alpha=1,beta=2 --closed K --max-num-seqs N`: weighted_fair with those weights, each
tenant saturating the server with K closed-loop clients (each sends its next request when its last
one ends); prints, for each `--window` (10 s) while both had requests waiting, the tokens each was
served and their ratio against the weights'.

Connections are kept alive and reused, as the `openai` client's pool does (`--no-keep-alive`: one
per request, each paying a TCP connect and uvicorn's accept). The server and the clients are
pinned to separate halves of the CPUs (`--no-pin`: not), as if the clients ran on another host:
see `_split_cpus`.

    .venv/bin/python bench/serve_load.py --rate 100 --duration 20

`--front N`: through the front of `metroline serve --replicas N` instead (every process a real
`metroline serve` child, on the simulated executor in real time): the same load at `--rate`
through the front, then at `--rate / N` straight to a single server (what each replica gets behind
the front); prints both sides' client TTFT and ITL percentiles, every status (a 502 counts as a
failure: the replicas are healthy), and the front's p99 TTFT overhead (the difference of the two
p99s). `--runs K` repeats the front's side K times (the statuses of all runs are summed).

    .venv/bin/python bench/serve_load.py --front 2 --rate 100 --duration 10 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import random
import resource
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

from serve_process import start_serve

TENANTS = {"alpha": "key-alpha", "beta": "key-beta", "gamma": "key-gamma"}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


_IDLE: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
"""Idle keep-alive connections to the server (the client process's pool)."""
_OPENED = [0]
"""Connections the client process opened."""


async def _send(host: str, port: int, head: bytes, keep_alive: bool):
    """A connection (an idle one from the pool with `keep_alive`, else a new one) with the request
    sent and the status line read: (reader, writer, status line). A pooled connection the server
    has closed meanwhile is replaced by a new one."""
    while True:
        pooled = keep_alive and bool(_IDLE)
        if pooled:
            reader, writer = _IDLE.pop()
        else:
            reader, writer = await asyncio.open_connection(host, port)
            _OPENED[0] += 1
        writer.write(head)
        try:
            await writer.drain()
            line = await reader.readline()
        except ConnectionError:
            line = b""
        if line or not pooled:
            return reader, writer, line
        writer.close()


async def _events(host: str, port: int, path: str, body: dict, key: str, keep_alive: bool = False):
    """POST `body` and yield (status, event payload) for each server-sent event: a minimal HTTP/1.1
    client on asyncio streams, far cheaper than a general client at hundreds of concurrent streams
    on two cores. With `keep_alive`, connections are pooled as the `openai` client's (httpx) are:
    a response read to its end gives its connection back; one given up on closes it."""
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n").encode() + data
    reader, writer, line = await _send(host, port, head, keep_alive)
    done = False
    try:
        status = int(line.split()[1])
        chunked, length = False, 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            lower = line.lower()
            if lower.startswith(b"transfer-encoding:") and b"chunked" in lower:
                chunked = True
            elif lower.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        if status != 200:
            await reader.readexactly(length)
            done = True
            yield status, None
            return
        buf = b""
        while True:
            if chunked:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    await reader.readline()  # the CRLF after the last chunk
                    done = True
                    return
                buf += await reader.readexactly(size + 2)
                buf = buf[:-2] if buf.endswith(b"\r\n") else buf
            else:
                more = await reader.read(65536)
                if not more:
                    return
                buf += more
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if ev.startswith(b"data: "):
                    yield 200, ev[6:]
    finally:
        if done and keep_alive:
            _IDLE.append((reader, writer))
        else:
            writer.close()


async def _one(url: str, tenant: str, body: dict, hang_up_after: int | None, out: list,
               keep_alive: bool = False) -> None:
    host, _, rest = url.removeprefix("http://").partition(":")
    port, _, path = rest.partition("/")
    start = time.monotonic()
    times, rid, status, tokens = [], None, 0, 0
    try:
        events = _events(host, int(port), "/" + path, body, TENANTS[tenant], keep_alive)
        async with contextlib.aclosing(events):  # a hang-up closes the connection now
            async for status, payload in events:
                if payload is None or payload == b"[DONE]":
                    continue
                chunk = json.loads(payload)
                rid = chunk["id"]
                content = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
                if content:
                    times.append(time.monotonic())
                    tokens += len(content.split())
                    if hang_up_after is not None and len(times) >= hang_up_after:
                        break
    except Exception as exc:  # noqa: BLE001 - a load test counts failures, it does not stop
        status = f"{type(exc).__name__}"
    out.append({"tenant": tenant, "status": status, "start": start, "times": times, "id": rid,
                "tokens": tokens, "hung_up": hang_up_after is not None})


def _body(rng: random.Random) -> dict:
    """A short streaming chat: a prompt of 5..39 words, 8..47 tokens."""
    return {"messages": [{"role": "user", "content": "hi " * rng.randrange(5, 40)}],
            "max_tokens": rng.randrange(8, 48), "stream": True, "temperature": 0}


async def _closed_loop(url: str, tenant: str, end: float, rng: random.Random, out: list, keep_alive: bool) -> None:
    """One client that sends its next request as soon as the last one ends, until `end`."""
    while time.monotonic() < end:
        await _one(url, tenant, _body(rng), None, out, keep_alive)


async def _clients(url: str, rate: float, duration: float, max_clients: int, disconnect: float, seed: int,
                   tenants: list[str], closed: int = 0, keep_alive: bool = False) -> dict:
    rng = random.Random(seed)
    out: list[dict] = []
    dropped = 0
    tasks: set[asyncio.Task] = set()
    t0 = time.monotonic()
    if closed:  # `closed` clients per tenant, each always with one request in flight
        loops = [_closed_loop(url, t, t0 + duration, random.Random(f"{seed}-{t}-{i}"), out, keep_alive)
                 for t in tenants for i in range(closed)]
        await asyncio.wait_for(asyncio.gather(*loops), timeout=duration + 120)
        return {"results": out, "dropped": 0, "wall": time.monotonic() - t0, "cpu": time.process_time(),
                "connections": _OPENED[0]}
    next_at = t0
    while next_at < t0 + duration:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += rng.expovariate(rate)
        tasks = {t for t in tasks if not t.done()}
        if len(tasks) >= max_clients:
            dropped += 1
            continue
        tenant = rng.choice(tenants)
        body = _body(rng)
        hang = rng.randrange(1, 4) if rng.random() < disconnect else None
        tasks.add(asyncio.create_task(_one(url, tenant, body, hang, out, keep_alive)))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    wall = time.monotonic() - t0
    return {"results": out, "dropped": dropped, "wall": wall, "cpu": time.process_time(), "connections": _OPENED[0]}


def _client_main(url: str, args: dict, conn, cpus: set[int] | None = None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        import uvloop

        conn.send(uvloop.run(_clients(url, **args)))
    except ImportError:
        conn.send(asyncio.run(_clients(url, **args)))
    conn.close()


def _split_cpus() -> tuple[set[int] | None, set[int] | None]:
    """The CPUs this process may use, split in two halves: the server's and the clients'. As a load
    generator on another host would, the clients then never wait for a CPU the server is busy on
    (and the other way round): Linux sometimes wakes a process on the CPU where the other one is
    running, and it then waits until that one blocks, up to a millisecond and more here
    (`bench/wake_latency.py` measures it). (None, None) with fewer than two CPUs or no affinity."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


class EngineTTFT:
    """Records each request's TTFT inside the engine (a plugin: `on_finished`)."""

    name = "engine_ttft"

    def __init__(self) -> None:
        self.ttft: dict[str, float] = {}
        self.arrival: dict[str, float] = {}
        """Arrival times on the engine clock (the executor's: monotonic seconds since its start)."""

    from metroline.core.plugins.hookspecs import hookimpl

    @hookimpl
    def on_finished(self, seqs) -> None:
        for s in seqs:
            if s.first_token_time is not None:
                self.ttft[s.request_id] = s.first_token_time - s.arrival_time
                self.arrival[s.request_id] = s.arrival_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="arrivals per second")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals (bounded: at most 120)")
    ap.add_argument("--max-clients", type=int, default=256, help="streams in flight at most (at most 1024)")
    ap.add_argument("--disconnect", type=float, default=0.1, help="share of clients hanging up mid-stream")
    ap.add_argument("--cost-model", default="linear", help="the simulated executor's cost model")
    ap.add_argument("--max-waiting", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default=None, help="the engine's policy (default fcfs; weighted_fair with --weights)")
    ap.add_argument("--weights", default=None, metavar="T=W,...",
                    help="weighted_fair's tenant weights, e.g. alpha=1,beta=2: only these tenants send, and the "
                         "tokens each was served are printed per --window while both had requests waiting")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of a fairness window (with --weights)")
    ap.add_argument("--closed", type=int, default=0, metavar="K",
                    help="instead of Poisson arrivals, K clients per tenant, each sending its next request as soon "
                         "as its last one ends (every tenant saturating the server: with --weights); no hang-ups")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="the engine's batch slots (default 256)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the server and the clients to separate CPUs")
    ap.add_argument("--keep-alive", action=argparse.BooleanOptionalAction, default=True,
                    help="reuse connections, as the openai client (httpx) does (default: on; --no-keep-alive: a "
                         "new connection per request)")
    ap.add_argument("--front", type=int, default=0, metavar="N",
                    help="through the front of `metroline serve --replicas N`, against a single server")
    ap.add_argument("--runs", type=int, default=1, help="with --front: runs through the front")
    args = ap.parse_args()
    duration, max_clients = min(args.duration, 120.0), min(args.max_clients, 1024)
    if args.front:
        _compare_front(args, duration, max_clients)
        return

    from metroline.core.config import EngineConfig
    from metroline.core.serving.server import ServerThread, make_engine
    from metroline.core.serving.tenants import ServeConfig
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.realtime import RealtimeExecutor
    from metroline.executors.simulated import SimulatedExecutor

    weights = _weights(args.weights)
    tenants = list(weights or TENANTS)
    fields: dict = {"policy": args.policy or ("weighted_fair" if weights else "fcfs")}
    if weights:
        fields["plugin_options"] = {"weighted_fair": {"weights": weights}}
    if args.max_num_seqs:
        fields["max_num_seqs"] = args.max_num_seqs
    recorder, served = EngineTTFT(), Served()
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model(args.cost_model)))
    engine = make_engine(EngineConfig(**fields), executor, plugins=[recorder, served])
    serve = ServeConfig(**({} if args.max_waiting is None else {"max_waiting": args.max_waiting}),
                        tenants={t: {"api_keys": [k]} for t, k in TENANTS.items()})
    load_before = os.getloadavg()[0]
    server_cpus, client_cpus = (None, None) if args.no_pin else _split_cpus()
    if server_cpus:
        os.sched_setaffinity(0, server_cpus)  # this thread; the server's thread, made next, inherits it
    with ServerThread(engine, serve) as srv:
        srv.server_state.timings = marks = {}
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        parent, child = mp.get_context("spawn").Pipe()
        proc = mp.get_context("spawn").Process(target=_client_main, args=(
            srv.url + "/v1/chat/completions",
            {"rate": args.rate, "duration": duration, "max_clients": max_clients,
             "disconnect": args.disconnect, "seed": args.seed, "tenants": tenants, "closed": args.closed,
             "keep_alive": args.keep_alive},
            child, client_cpus))
        proc.start()
        doc = parent.recv()
        proc.join(30)
        steps, busy = executor.stats.total_steps, executor.stats.busy_time
        server_cpu = time.process_time()
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches
    results = doc["results"]
    ok = [r for r in results if r["status"] == 200 and r["times"]]
    ttft = [r["times"][0] - r["start"] for r in ok]
    itl = [b - a for r in ok for a, b in zip(r["times"], r["times"][1:])]
    t0 = executor._t0  # engine time t is monotonic time t0 + t
    legs: dict[str, list[float]] = {k: [] for k in (
        "server overhead", "  client -> handler", "  handler -> engine", "  token -> written",
        "  written -> client", "  inside the app")}
    engine_ttft = []
    for r in ok:
        rid = r["id"].partition("-")[2]
        if rid not in recorder.ttft or len(marks.get(rid, ())) < 2:
            continue
        started, written = marks[rid]
        arrival, first = recorder.arrival[rid], recorder.ttft[rid]
        engine_ttft.append(first)
        legs["server overhead"].append(r["times"][0] - r["start"] - first)
        legs["  client -> handler"].append(t0 + started - r["start"])
        legs["  handler -> engine"].append(arrival - started)
        legs["  token -> written"].append(written - (arrival + first))
        legs["  written -> client"].append(r["times"][0] - (t0 + written))
        legs["  inside the app"].append(arrival - started + written - (arrival + first))
    overhead = legs["server overhead"]
    asked = f"{args.closed} closed-loop clients per tenant" if args.closed else f"{args.rate:g}/s asked"
    print(f"arrivals {len(results) + doc['dropped']} in {duration:.0f} s ({asked}), "
          f"wall {doc['wall']:.1f} s, completed {sum(not r['hung_up'] for r in ok)}, "
          f"hung up {sum(r['hung_up'] for r in results)}, 429 {sum(r['status'] == 429 for r in results)}, "
          f"other errors {sum(r['status'] not in (200, 429) for r in results)}, dropped (client cap) {doc['dropped']}")
    print(f"CPUs: server {sorted(server_cpus) if server_cpus else 'any'}, "
          f"clients {sorted(client_cpus) if client_cpus else 'any'}; connections opened {doc['connections']} "
          f"({'kept alive' if args.keep_alive else 'one per request'})")
    print(f"engine: {steps} steps, modeled busy {busy:.1f} s; CPU seconds: server process "
          f"{server_cpu:.1f}, client process {doc['cpu']:.1f}; server waits (voluntary context switches) "
          f"{switches}; load average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for name, vals in (("client TTFT", ttft), ("engine TTFT", engine_ttft), *legs.items(), ("client ITL", itl)):
        print(f"{name:<20} ms  p50 {1e3 * pct(vals, 50):7.2f}  p90 {1e3 * pct(vals, 90):7.2f}  "
              f"p99 {1e3 * pct(vals, 99):7.2f}  max {1e3 * max(vals, default=float('nan')):7.2f}")
    if ttft:
        print(f"server overhead / client TTFT: p50 {pct(overhead, 50) / pct(ttft, 50):.1%}, "
              f"p99 {pct(overhead, 99) / pct(ttft, 99):.1%}")
    for tenant in tenants:
        toks = sum(r["tokens"] for r in ok if r["tenant"] == tenant)
        print(f"tenant {tenant:<6} {toks / doc['wall']:8.1f} tokens/s  "
              f"{sum(1 for r in ok if r['tenant'] == tenant)} streams")
    if weights:
        _print_shares(served, weights, args.window, duration)


def _weights(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    weights = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name not in TENANTS or not value:
            raise SystemExit(f"--weights: {part!r}: give TENANT=WEIGHT with TENANT one of {', '.join(TENANTS)}")
        weights[name] = float(value)
    return weights


class Served:
    """Records every ended request (a plugin: `on_finished`), for the fairness windows."""

    name = "served"

    def __init__(self) -> None:
        from metroline.core.results.metrics import MetricsCollector

        self.records = MetricsCollector(1)

    from metroline.core.plugins.hookspecs import hookimpl

    @hookimpl
    def on_finished(self, seqs) -> None:
        for seq in seqs:
            self.records.record_finished(seq)


def _print_shares(served: Served, weights: dict[str, float], window: float, duration: float) -> None:
    """Per window of `window` seconds within the arrivals (`duration` seconds from the first) in which
    every weighted tenant had requests waiting: the tokens each was served (prompt and output, as
    the engine made them) and their ratio against the weights' (weighted_fair's service: prompt
    tokens at 1, output tokens at 2)."""
    from metroline.core.results.metrics import fairness

    records = served.records.requests
    start = min(r.arrival_s for r in records)
    doc = fairness(records, window_s=window, w_in=1.0, w_out=2.0, weights=weights)
    names = sorted(weights, key=weights.get)
    low, high = names[0], names[-1]
    want = weights[high] / weights[low]
    print(f"fairness windows of {window:g} s while both tenants were backlogged: tokens served "
          f"{high}/{low} against {want:g} (weighted service in brackets)")
    worst = 0.0
    for w in doc["windows"]:
        if w["end_s"] - w["start_s"] < window - 1e-9 or w["end_s"] > start + duration:
            continue  # the last window is cut; the drain after the arrivals is not a contest
        if not set(weights) <= set(w["backlogged"]):
            continue
        toks = {t: w["input"][t] + w["output"][t] for t in names}
        ratio = toks[high] / toks[low] if toks[low] else float("inf")
        service = w["service"][high] / w["service"][low] if w["service"][low] else float("inf")
        worst = max(worst, abs(ratio / want - 1))
        print(f"  [{w['start_s'] - start:6.1f}, {w['end_s'] - start:6.1f}) s  {low} {toks[low]:7d}  "
              f"{high} {toks[high]:7d}  ratio {ratio:5.3f} ({service:5.3f})  off by {ratio / want - 1:+.1%}")
    print(f"largest deviation from {want:g}: {worst:.1%}")



def _serve(folder: Path, cost_model: str, replicas: int, max_num_seqs: int | None):
    """A `metroline serve` child (the front of `replicas` when more than 1) with the bench's tenants;
    (process, url) once it answers /health."""
    config = folder / "serve.toml"
    lines = [f"max_num_seqs = {max_num_seqs}" if max_num_seqs else "", "[serve]"]
    for tenant, key in TENANTS.items():
        lines += [f"[serve.tenants.{tenant}]", f'api_keys = ["{key}"]']
    config.write_text("\n".join(lines) + "\n")
    flags = ["--replicas", str(replicas)] if replicas > 1 else []
    root = os.environ.get("PYTHONPATH") or str(Path(__file__).resolve().parents[2])
    return start_serve(["--config", str(config), "--cost-model", cost_model, *flags], root)


def _load(url: str, args: argparse.Namespace, rate: float, duration: float, max_clients: int, seed: int) -> dict:
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_client_main, args=(
        url + "/v1/chat/completions",
        {"rate": rate, "duration": duration, "max_clients": max_clients, "disconnect": args.disconnect,
         "seed": seed, "tenants": list(TENANTS), "keep_alive": args.keep_alive}, child))
    proc.start()
    doc = parent.recv()
    proc.join(30)
    return doc


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process `pid` itself has used (not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _compare_front(args: argparse.Namespace, duration: float, max_clients: int) -> None:
    """The same load through the front of `args.front` replicas and, at 1/N of the rate, straight
    to one server: TTFT, ITL and statuses of both, the front's p99 TTFT overhead, and the CPU time
    of the front's own process (the single server's process) per request sent: what the front
    costs per streamed request, a figure a machine busy with other work does not move much."""
    n = args.front
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for label, replicas, rate, runs in ((f"front of {n}", n, args.rate, args.runs),
                                           ("single server", 1, args.rate / n, 1)):
            proc, url = _serve(Path(folder), args.cost_model, replicas, args.max_num_seqs)
            cpu = 0.0
            try:
                docs = []
                for run in range(runs):
                    before = _cpu_s(proc.pid)
                    docs.append(_load(url, args, rate, duration, max_clients, args.seed + run))
                    cpu += _cpu_s(proc.pid) - before
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            results = [r for d in docs for r in d["results"]]
            ok = [r for r in results if r["status"] == 200 and r["times"]]
            ttft = [r["times"][0] - r["start"] for r in ok]
            itl = [b - a for r in ok for a, b in zip(r["times"], r["times"][1:])]
            statuses = Counter(str(r["status"]) for r in results)
            rows.append((label, rate, runs, ttft, itl, statuses, sum(d["dropped"] for d in docs),
                         cpu / max(1, len(results))))
    print(f"{args.rate:g} streams/s for {duration:g} s through the front of {n} replicas ({args.runs} runs), "
          f"{args.rate / n:g}/s straight to one server; simulated executor ({args.cost_model}), load average "
          f"{os.getloadavg()[0]:.1f}")
    for label, rate, runs, ttft, itl, statuses, dropped, cpu in rows:
        print(f"{label:<14} {rate:6.1f}/s  TTFT ms p50 {1e3 * pct(ttft, 50):7.2f} p99 {1e3 * pct(ttft, 99):7.2f}  "
              f"ITL ms p50 {1e3 * pct(itl, 50):6.2f} p99 {1e3 * pct(itl, 99):6.2f}  "
              f"process CPU {1e6 * cpu:7.0f} us/request  statuses {dict(statuses)}"
              f"{f'  dropped (client cap) {dropped}' if dropped else ''}")
    front, single = rows[0][3], rows[1][3]
    print(f"front p99 TTFT overhead: {1e3 * (pct(front, 99) - pct(single, 99)):+.2f} ms "
          f"(p50 {1e3 * (pct(front, 50) - pct(single, 50)):+.2f} ms); 502 through the front: {rows[0][5]['502']}")


if __name__ == "__main__":
    main()
