"""Random engine configurations and workloads run under the KV shadow (`kv_shadow.KVShadow`).

A `Scenario` is a configuration (block size, a pool that holds the largest request alone with
little or no slack, swap or recompute, prefix caching by block or by token, a shipped policy with
stacked plugins, speculation, the vLLM preset), requests (shared prefixes, `n > 1`) arriving at
given steps, and aborts at given steps. `run_scenario` runs one on the simulated executor under
the shadow and returns what went wrong: a read of a slot holding other KV, a swapped-out copy that
is not the sequence's KV, a leaked block, a request that did not finish, an exception. `shrink`
makes a failing scenario smaller while it still fails the same way.

`draw_scenario(draw)` builds a scenario from any source of choices (`RandomDraw` over
`random.Random` for `bench/kv_chaos.py`; a hypothesis adapter in `tests/test_kv_shadow.py`), so
the property test and the bench draw from the same space.
"""

from __future__ import annotations

import json
import random
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence as Seq

from ..plugins.hookspecs import hookimpl
from ..plugins.victims import last_admitted
from ..requests.sequence import RUNNING
from .kv_shadow import KVShadow

POLICIES = ("fcfs", "static", "priority", "srpt", "weighted_fair", "token_rr", "prefix_aware", "residual_sjf")
"""The shipped base policies a scenario runs under."""
STACKING = (
    "decode_first", "prefill_first", "weighted_budget", "reserve", "auto_preemption", "tenant_quota", "slo_classes",
    "tenant_shares", "prefix_aware", "length_mean", "adaptive_speculation", "least_computed", "session_affinity",
)
"""The shipped plugins a scenario may stack on its policy (at most three)."""
NEWEST_VICTIM = "metroline.core.conformance.kv_chaos:NewestVictim"
"""A `select_victim` plugin a scenario may stack too (`NewestVictim`)."""
TENANTS = ("a", "b", "c")
BLOCK_SIZES = (1, 2, 3, 4, 5, 8, 16, 64)


class Draw(Protocol):
    """A source of choices: `integers(lo, hi)` (inclusive), `choice(options)`, `boolean()`."""

    def integers(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Seq[Any]) -> Any: ...

    def boolean(self) -> bool: ...


class RandomDraw:
    """`Draw` over a seeded `random.Random`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integers(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Seq[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def boolean(self) -> bool:
        return self.rng.random() < 0.5


@dataclass
class Scenario:
    """One random run: `config` (EngineConfig fields), `requests` as `(arrival step, request
    dict)`, sorted by arrival, and `aborts` as `(step, request id)`."""

    config: dict[str, Any]
    requests: list[tuple[int, dict[str, Any]]]
    aborts: list[tuple[int, str]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"config": self.config, "requests": self.requests, "aborts": self.aborts},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        doc = json.loads(text)
        return cls(doc["config"], [(int(a), r) for a, r in doc["requests"]], [(int(s), r) for s, r in doc["aborts"]])

    def summary(self) -> str:
        """One line: the configuration's main choices and the requests' shapes."""
        c = self.config
        parts = [
            f"block_size={c['block_size']}", f"num_blocks={c['num_blocks']}", f"{c['preemption_mode']}",
            f"swap_space_blocks={c.get('swap_space_blocks', 0)}",
            f"prefix_caching={'off' if not c['enable_prefix_caching'] else c['prefix_match']}",
            f"policy={c['policy']}" + (f"+{'+'.join(c['plugins'])}" if c["plugins"] else ""),
            f"max_num_seqs={c['max_num_seqs']}", f"budget={c['max_num_batched_tokens']}",
            f"chunk={c['max_prefill_chunk']}",
        ]
        if c.get("preset"):
            parts.append(f"preset={c['preset']}")
        if c.get("speculative_config"):
            parts.append(f"speculation={c['speculative_config']['num_speculative_tokens']}")
        reqs = ", ".join(
            f"{r['request_id']}@{a}:{len(r['prompt_token_ids'])}+{r['sampling']['max_new_tokens']}"
            + (f"x{r['sampling']['n']}" if r["sampling"]["n"] > 1 else "")
            for a, r in self.requests
        )
        aborts = f"; aborts {self.aborts}" if self.aborts else ""
        return " ".join(parts) + f"; requests {reqs}{aborts}"


class NewestVictim:
    """Names the running request admitted last as the victim: for a running requester always,
    for a waiting or swapped one once a step (the `select_victim` contract allows any running
    request). Admission of a request may then preempt one admitted earlier in the same step, on
    a prefix hit of blocks that step registered: what the KV backend's pending rule is for
    (`metroline.kv_backends.pending`). (More than once a step, two candidates could displace
    each other until the step's bound on admission pulls ends it.)"""

    name = "newest_victim"

    def __init__(self) -> None:
        self.step = -1

    @hookimpl
    def select_victim(self, ctx: Any, requester: Any) -> Any:
        if requester.state is not RUNNING:
            if self.step == ctx.step:
                return None
            self.step = ctx.step
        return last_admitted(ctx.running)


def blocks_alone(prompt: int, out: int, n: int, block_size: int) -> int:
    """Blocks a request needs when it runs alone: each of its `n` samples holds its whole context
    (shared prompt blocks counted once per sample: an upper bound)."""
    return n * -(-(prompt + out) // block_size)


def draw_scenario(draw: Draw) -> Scenario:
    """A random scenario (see the module docstring)."""
    block_size = draw.choice(BLOCK_SIZES) if draw.boolean() else draw.integers(1, 64)
    num_requests = draw.integers(1, 12)
    prefixes = [[draw.integers(1, 50) for _ in range(draw.integers(1, 3 * block_size + 2))] for _ in range(2)]
    requests = []
    for i in range(num_requests):
        prompt = list(prefixes[draw.integers(0, 1)]) if draw.integers(0, 4) else []
        prompt += [1000 * (i + 1) + j for j in range(draw.integers(1, 40))]
        requests.append({
            "request_id": f"r{i}", "prompt_token_ids": prompt, "tenant": draw.choice(TENANTS),
            "priority": draw.integers(0, 3),
            "sampling": {"max_new_tokens": draw.integers(1, 24), "n": draw.choice((1, 1, 1, 2, 3))},
        })
    largest = max(
        blocks_alone(len(r["prompt_token_ids"]), r["sampling"]["max_new_tokens"], r["sampling"]["n"], block_size)
        for r in requests
    )
    num_blocks = largest + draw.choice((0, 0, 1, 2, largest // 2, largest, 2 * largest))
    mode = draw.choice(("recompute", "swap", "swap"))
    policy = draw.choice(POLICIES)
    stack: list[str] = []
    for _ in range(draw.integers(0, 3)):
        name = draw.choice(STACKING)
        if name not in stack and name != policy:
            stack.append(name)
    if mode != "swap" and "auto_preemption" in stack:
        stack.remove("auto_preemption")
    if draw.integers(0, 4) == 0:
        stack.append(NEWEST_VICTIM)
    options: dict[str, Any] = {
        "weighted_fair": {"preempt": draw.boolean()},
        "priority": {"aging_rate": draw.choice((0.0, 0.5, 5.0))},
        "slo_classes": {"classes": {"a": "interactive"}},
        "tenant_quota": {"default_max_running": 3, "token_rate": {"b": 400.0}, "burst": 200.0},
        "tenant_shares": {"shares": {"a": 0.3}},
        "session_affinity": {"prefix_tokens": 8, "max_head_wait_s": 10.0},
    }
    options = {name: o for name, o in options.items() if name == policy or name in stack}
    budget = draw.integers(1, 8) if draw.boolean() else draw.integers(1, 96)
    config: dict[str, Any] = dict(
        block_size=block_size, num_blocks=num_blocks, policy=policy, plugins=stack, plugin_options=options,
        max_num_seqs=draw.integers(1, 8), max_num_batched_tokens=budget,
        max_prefill_chunk=draw.integers(1, budget), preemption_mode=mode,
        swap_space_blocks=draw.integers(1, 2 * num_blocks) if mode == "swap" else 0,
        enable_prefix_caching=draw.choice((True, True, False)), prefix_match=draw.choice(("block", "token")),
        admit_after_preemption=draw.boolean(),
        admission_gate=draw.choice(("full_prompt", "first_chunk")),
    )
    if not stack and policy in ("fcfs", "priority") and draw.integers(0, 3) == 0:
        config["preset"] = "vllm"
        if policy == "priority":  # vLLM's priority scheduler does not age
            options["priority"]["aging_rate"] = 0.0
    if draw.integers(0, 3) == 0:  # n-gram drafts, accepted or not, rolled back
        config["speculative_config"] = {
            "method": "ngram", "num_speculative_tokens": draw.integers(1, 4),
            "acceptance_rate": draw.choice((0.0, 0.6, 1.0)), "num_lookahead_tokens": draw.integers(0, 2),
            "seed": draw.integers(0, 3),
        }
    arrivals = sorted(draw.choice((0, 0, 0, 1, 5, 30)) for _ in range(num_requests))
    aborts = [(draw.integers(0, 120), f"r{draw.integers(0, num_requests - 1)}") for _ in range(draw.choice((0, 0, 1, 2)))]
    return Scenario(config, list(zip(arrivals, requests)), aborts)


def step_bound(scenario: Scenario) -> int:
    """A generous bound on a run's steps: 20 per token any sample computes or generates, plus 200
    and the last arrival (a livelock of mutual preemption runs past any bound)."""
    total = sum((len(r["prompt_token_ids"]) + r["sampling"]["max_new_tokens"]) * r["sampling"]["n"]
                for _, r in scenario.requests)
    return 20 * total + 200 + max((a for a, _ in scenario.requests), default=0)


@dataclass
class Outcome:
    """What a run found (`errors`, empty when clean) and how much it did."""

    errors: list[str]
    steps: int = 0
    reads: int = 0
    preemptions: int = 0
    swap_outs: int = 0
    engine: Any = field(default=None, repr=False)
    """The engine it ran on (its requests' sequences, its pool), when it was built."""

    @property
    def kind(self) -> str:
        """The first error's kind: its text after the step number, up to the sequence's details."""
        if not self.errors:
            return ""
        text = self.errors[0].split(": ", 1)[-1]
        for marker in ("reads wrong KV", "swapped out with wrong KV", "leaked", "invariant", "did not finish",
                       "not finished", "raised"):
            if marker in text:
                return marker
        return text[:40]


def run_scenario(scenario: Scenario, inner: Any = None, engine_plugins: Seq[Any] = (), *,
                 run_through: bool = False) -> Outcome:
    """Run `scenario` under a `KVShadow` over `inner` (default: the simulator), with
    `engine_plugins` stacked on the configuration's: requests arrive at their steps, aborts
    happen at theirs; then every request must have finished (or been cancelled, or refused at
    submission) and every block be back. The run stops at the shadow's first error, unless
    `run_through` (to see what a real executor computes on the wrong KV)."""
    from ..config import EngineConfig
    from ..errors import RequestRefused
    from ..step.engine import Engine

    shadow = KVShadow(inner)
    errors = shadow.errors
    steps = 0
    try:
        engine = shadow.attach(Engine(EngineConfig(**scenario.config), shadow, plugins=list(engine_plugins)))
    except Exception as exc:  # an invalid configuration is the generator's fault, and is reported
        return Outcome([f"EngineConfig raised {type(exc).__name__}: {exc}"])
    arrivals = list(scenario.requests)
    aborts: dict[int, list[str]] = {}
    for step, rid in scenario.aborts:
        aborts.setdefault(step, []).append(rid)
    refused: set[str] = set()
    bound = step_bound(scenario)
    try:
        while engine.has_unfinished() or arrivals:
            while arrivals and arrivals[0][0] <= steps:
                req = arrivals.pop(0)[1]
                try:
                    engine.add_request(req)
                except (RequestRefused, ValueError):
                    refused.add(req["request_id"])
            for rid in aborts.get(steps, ()):
                if rid in engine.intake.requests:
                    engine.abort(rid)
            engine.step()
            if engine.last_plan_empty:
                engine.idle()
            steps += 1
            if errors and not run_through:
                break
            if steps > bound:
                errors.append(f"step {steps}: not finished after {steps} steps")
                break
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        errors.append(f"step {steps}: raised {type(exc).__name__}: {exc} ({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})")
    if not errors or run_through:
        aborted = {rid for _, rid in scenario.aborts}
        for _, req in scenario.requests:
            rid = req["request_id"]
            if rid in refused:
                continue
            for seq in engine.sequences(rid):
                reason = seq.finish_reason.value if seq.finish_reason is not None else None
                if reason == "cancelled" and rid in aborted:
                    continue
                if reason != "length" or seq.num_output_tokens != req["sampling"]["max_new_tokens"]:
                    errors.append(f"{seq.seq_id} did not finish: {reason} with {seq.num_output_tokens} tokens "
                                  f"({seq.error})")
        shadow.check_drained()
    stats = getattr(shadow.inner, "stats", None)
    return Outcome(list(errors), steps, shadow.reads, engine.scheduler.total_preemptions,
                   stats.swap_outs if stats is not None else 0, engine)


def shrink(scenario: Scenario, fails: Callable[[Scenario], bool], budget: int = 400) -> Scenario:
    """A smaller scenario for which `fails` still holds (greedy: drop requests, aborts, plugins,
    speculation and the preset; shorten outputs, prompts and arrivals; lower the budget), trying
    at most `budget` candidates."""
    tries = 0

    def attempt(candidate: Scenario) -> bool:
        nonlocal tries
        tries += 1
        try:
            return fails(candidate)
        except Exception:
            return False

    changed = True
    while changed and tries < budget:
        changed = False
        for candidate in _smaller(scenario):
            if tries >= budget:
                break
            if attempt(candidate):
                scenario, changed = candidate, True
                break
    return scenario


def _smaller(s: Scenario) -> Any:
    """Candidate reductions of `s`, the biggest first."""
    c = s.config
    for i in range(len(s.requests)):
        rid = s.requests[i][1]["request_id"]
        yield replace(s, requests=s.requests[:i] + s.requests[i + 1:], aborts=[a for a in s.aborts if a[1] != rid])
    for i in range(len(s.aborts)):
        yield replace(s, aborts=s.aborts[:i] + s.aborts[i + 1:])
    for key in ("speculative_config", "preset"):
        if c.get(key):
            yield replace(s, config={k: v for k, v in c.items() if k != key})
    for name in c["plugins"]:
        plugins = [p for p in c["plugins"] if p != name]
        options = {k: v for k, v in c["plugin_options"].items() if k != name}
        yield replace(s, config=dict(c, plugins=plugins, plugin_options=options))
    for i, (arrival, req) in enumerate(s.requests):
        smp = req["sampling"]
        variants = []
        if smp["max_new_tokens"] > 1:
            variants.append(dict(req, sampling=dict(smp, max_new_tokens=max(1, smp["max_new_tokens"] // 2))))
            variants.append(dict(req, sampling=dict(smp, max_new_tokens=smp["max_new_tokens"] - 1)))
        if smp["n"] > 1:
            variants.append(dict(req, sampling=dict(smp, n=smp["n"] - 1)))
        prompt = req["prompt_token_ids"]
        if len(prompt) > 1:
            variants.append(dict(req, prompt_token_ids=prompt[: max(1, len(prompt) // 2)]))
            variants.append(dict(req, prompt_token_ids=prompt[:-1]))
        for v in variants:
            yield replace(s, requests=s.requests[:i] + [(arrival, v)] + s.requests[i + 1:])
        if arrival:
            yield replace(s, requests=sorted(s.requests[:i] + [(arrival // 2, req)] + s.requests[i + 1:],
                                             key=lambda ar: ar[0]))
    if c["num_blocks"] > 1:
        yield replace(s, config=dict(c, num_blocks=c["num_blocks"] - 1))
    if c.get("swap_space_blocks", 0) > 1:
        yield replace(s, config=dict(c, swap_space_blocks=c["swap_space_blocks"] // 2))
