"""Workloads: synthetic generation, built-ins, trace loaders, modifiers and their errors."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from metroline.core.workloads.build import (
    BUILTIN_WORKLOADS,
    SyntheticSpec,
    Workload,
    WorkloadError,
    WorkloadItem,
    build_workload,
    find_traces_dir,
    generate,
    list_workloads,
    load_spec,
    segment_tokens,
)
from metroline.core.workloads.traces import load_azure, load_mooncake

try:
    TRACES = find_traces_dir()
except WorkloadError:  # a checkout without ../shared/traces: the trace tests skip
    TRACES = None
needs_traces = pytest.mark.skipif(TRACES is None, reason="no traces directory (../shared/traces or $METROLINE_TRACES)")


def spec(**kw) -> SyntheticSpec:
    base = {"num_requests": 100, "rate": 10.0, "prompt_len": 32, "output_len": 8}
    return SyntheticSpec(**{**base, **kw})


def gaps(items: list[WorkloadItem]) -> list[float]:
    return [b.arrival_s - a.arrival_s for a, b in zip(items, items[1:])]


# --- tokens -----------------------------------------------------------------------------------


def test_segment_stream_is_prefix_stable_for_any_length():
    full = segment_tokens(("k", 1), 1001)
    for n in (1, 2, 3, 7, 512, 999, 1000):
        assert segment_tokens(("k", 1), n) == full[:n]
    assert segment_tokens(("k", 2), 1001) != full


@pytest.mark.parametrize("vocab", [1, 7, 256, 1000, 32000, 50257, 70000])
def test_tokens_lie_in_vocab(vocab):
    toks = segment_tokens("v", 5000, vocab)
    assert len(toks) == 5000 and min(toks) >= 0 and max(toks) < vocab
    if vocab >= 256:
        assert len(set(toks)) > min(vocab, 5000) // 4


def test_to_request_carries_the_item():
    item = WorkloadItem(1.5, ((("a",), 10), (("b",), 5)), 7, tenant="t", priority=2)
    assert item.prompt_len == 15
    req = item.to_request("r1")
    assert (req.request_id, req.tenant, req.priority, req.arrival_time) == ("r1", "t", 2, 1.5)
    assert req.prompt_token_ids == segment_tokens(("a",), 10) + segment_tokens(("b",), 5)
    assert req.sampling.max_new_tokens == 7 and req.sampling.ignore_eos and req.sampling.temperature == 0.0
    assert req.expected_output_tokens is None
    assert item.to_request("r2", oracle=True).expected_output_tokens == 7
    assert max(item.to_request("r3", vocab_size=100).prompt_token_ids) < 100


# --- synthetic ----------------------------------------------------------------------------------


def test_same_seed_same_items_and_tokens_other_seed_differs():
    s = spec(prompt_len={"dist": "uniform", "low": 1, "high": 300}, tenants={"a": 1, "b": 1}, seed=3)
    a, b, c = generate(s), generate(s), generate(s.model_copy(update={"seed": 4}))
    assert a == b
    assert [it.prompt_token_ids() for it in a] == [it.prompt_token_ids() for it in b]
    assert [it.arrival_s for it in a] != [it.arrival_s for it in c]
    assert [it.prompt_len for it in a] != [it.prompt_len for it in c]
    assert a[0].prompt_token_ids() != c[0].prompt_token_ids()


def test_poisson_mean_interarrival():
    items = generate(spec(num_requests=20_000, rate=100.0))
    assert items[0].arrival_s == 0.0
    g = gaps(items)
    assert statistics.fmean(g) == pytest.approx(0.01, rel=0.03)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_burstiness_sets_the_cv(shape):
    items = generate(spec(num_requests=20_000, rate=50.0, arrival="gamma", burstiness=shape))
    g = gaps(items)
    assert statistics.fmean(g) == pytest.approx(0.02, rel=0.05)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(shape**-0.5, rel=0.1)


def test_no_rate_puts_everything_at_zero():
    assert {it.arrival_s for it in generate(spec(rate=None))} == {0.0}


def test_tenant_and_priority_shares():
    items = generate(spec(num_requests=20_000, tenants={"a": 5, "b": 3, "c": 2}, priorities={0: 1, 3: 3}))
    n = len(items)
    tenants, prios = Counter(it.tenant for it in items), Counter(it.priority for it in items)
    for name, share in {"a": 0.5, "b": 0.3, "c": 0.2}.items():
        assert tenants[name] / n == pytest.approx(share, abs=0.015)
    assert set(prios) == {0, 3} and prios[3] / n == pytest.approx(0.75, abs=0.015)


def test_length_distributions_respect_their_bounds():
    fixed = generate(spec(num_requests=500, prompt_len=17, output_len={"dist": "fixed", "value": 3}))
    assert {(it.prompt_len, it.output_len) for it in fixed} == {(17, 3)}

    uniform = {"dist": "uniform", "low": 5, "high": 9}
    assert {it.prompt_len for it in generate(spec(num_requests=5000, prompt_len=uniform))} == {5, 6, 7, 8, 9}

    logn = {"dist": "lognormal", "mean": 200, "sigma": 1.0, "min": 10, "max": 1000}
    lens = [it.output_len for it in generate(spec(num_requests=20_000, output_len=logn))]
    assert min(lens) == 10 and max(lens) == 1000
    unclipped = {"dist": "lognormal", "mean": 200, "sigma": 0.5}
    lens = [it.output_len for it in generate(spec(num_requests=20_000, output_len=unclipped))]
    assert statistics.fmean(lens) == pytest.approx(200, rel=0.03)


def test_shared_prefix_is_shared_and_suffixes_differ():
    items = generate(spec(num_requests=50, shared_prefix_len=100, prompt_len=20))
    toks = [it.prompt_token_ids() for it in items]
    assert all(len(t) == 120 and t[:100] == toks[0][:100] for t in toks)
    assert len({tuple(t[100:]) for t in toks}) == 50

    items = generate(spec(num_requests=400, shared_prefix_len=64, num_prefixes=4))
    prefixes = Counter(tuple(it.prompt_token_ids()[:64]) for it in items)
    assert len(prefixes) == 4 and min(prefixes.values()) > 60


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"num_requests": 0}, "num_requests"),
        ({"rate": 0}, "rate"),
        ({"arrival": "uniform"}, "arrival"),
        ({"bogus": 1}, "bogus"),
        ({"prompt_len": {"dist": "uniform", "low": 9, "high": 5}}, "high (5) must be >= low (9)"),
        ({"prompt_len": {"dist": "lognormal", "mean": 9, "sigma": 1, "min": 10, "max": 5}}, "max (5)"),
        ({"output_len": 0}, "output_len"),
        ({"tenants": {"a": 0}}, "tenants"),
        ({"burstiness": 2.0}, "burstiness"),
        ({"num_prefixes": 3}, "shared_prefix_len"),
    ],
)
def test_spec_errors_name_the_field(kw, field):
    with pytest.raises(ValidationError, match=field.replace("(", r"\(").replace(")", r"\)")):
        spec(**kw)


def test_spec_files(tmp_path):
    toml = tmp_path / "load.toml"
    toml.write_text(
        'num_requests = 30\nrate = 5.0\nprompt_len = {dist = "uniform", low = 4, high = 8}\n'
        "output_len = 6\nseed = 9\n[priorities]\n0 = 1\n2 = 1\n"
    )
    loaded = load_spec(toml)
    assert loaded.seed == 9 and loaded.priorities == {0: 0.5, 2: 0.5}
    w = build_workload(str(toml))
    assert (w.name, len(w), w.params["spec"]["seed"]) == ("load", 30, 9)
    assert build_workload(str(toml)).items == w.items
    assert build_workload(str(toml), seed=10).items != w.items

    js = tmp_path / "load.json"
    js.write_text(json.dumps({"num_requests": 3, "prompt_len": 4, "output_len": 5}))
    assert len(build_workload(str(js))) == 3

    bad = tmp_path / "bad.toml"
    bad.write_text("num_requests = 0\nprompt_len = 1\noutput_len = 1\n")
    invalid = r"bad\.toml: invalid workload spec:\n  num_requests: .*greater than or equal to 1"
    with pytest.raises(WorkloadError, match=invalid):
        build_workload(str(bad))
    bad.write_text("num_requests = [\n")
    with pytest.raises(WorkloadError, match=r"bad\.toml: cannot read"):
        build_workload(str(bad))


# --- built-ins --------------------------------------------------------------------------------


def test_builtin_names_and_descriptions():
    assert list_workloads() == list(BUILTIN_WORKLOADS)
    names = {"chat", "mixed-64", "shared-prefix", "azure-conv", "azure-code", "mooncake", "long-burst"}
    assert names <= set(BUILTIN_WORKLOADS)


def test_chat():
    w = build_workload("chat")
    d = w.describe()
    assert d["requests"] == 4000 and d["seed"] == 0 and "220 req/s" in d["description"]
    assert d["duration_s"] == w.items[-1].arrival_s
    assert 3999 / d["duration_s"] == pytest.approx(220, rel=0.05)
    assert {it.tenant for it in w} == {"alpha", "beta", "gamma"} and {it.priority for it in w} == {0, 1}
    assert all(128 + 16 <= it.prompt_len <= 128 + 4096 and 4 <= it.output_len <= 1024 for it in w)
    assert len({it.segments[0] for it in w}) == 4
    assert build_workload("chat", seed=1).items != w.items


@pytest.mark.parametrize("name", ["chat", "chat-steady", "shared-prefix", "long-burst", "mixed-64"])
def test_max_requests_keeps_the_first_requests_of_the_whole_builtin(name):
    # chat, chat-steady and shared-prefix make only the requests kept: they must be the whole
    # workload's first ones by arrival, for any cut and seed (the others cut the whole workload)
    whole = build_workload(name, seed=3).items
    for k in (1, 37, len(whole) - 1, len(whole), len(whole) + 5):
        assert build_workload(name, seed=3, max_requests=k).items == whole[:k]


def test_mixed_64():
    w = build_workload("mixed-64")
    assert len(w) == 640 and Counter(it.output_len for it in w) == {20: 540, 2000: 100}
    assert Counter(it.arrival_s for it in w) == {g * 0.1: 64 for g in range(10)}
    for g in range(10):
        outs = [it.output_len for it in w.items[g * 64 : (g + 1) * 64]]
        assert outs.count(2000) == 10 and outs[-10:] != [2000] * 10
    assert {it.prompt_len for it in w} == {64} and len({it.segments for it in w}) == 640
    w3 = build_workload("mixed-64", groups=3)
    assert len(w3) == 192 and w3.describe()["groups"] == 3 and w3.items[-1].arrival_s == 0.2


def test_shared_prefix_builtin():
    w = build_workload("shared-prefix")
    assert len(w) == 200 and {(it.prompt_len, it.output_len) for it in w} == {(1032, 32)}
    assert len({it.segments[0] for it in w}) == 1 and len({it.segments[1] for it in w}) == 200
    assert 199 / w.items[-1].arrival_s == pytest.approx(50, rel=0.2)


def test_long_burst():
    w = build_workload("long-burst")
    burst = [it for it in w if it.tenant == "burst"]
    chats = [it for it in w if it.tenant == "chat"]
    assert len(burst) == 16 and len(chats) == 600 and len(w) == 616
    assert {(it.arrival_s, it.prompt_len, it.output_len) for it in burst} == {(10.0, 8192, 16)}
    assert {(it.prompt_len, it.output_len) for it in chats} == {(256, 256)}
    assert w.items[-1].arrival_s > 20


@needs_traces
def test_unknown_sources_and_misused_options(tmp_path, monkeypatch):
    with pytest.raises(WorkloadError, match="unknown workload 'nope'.*chat"):
        build_workload("nope")
    with pytest.raises(WorkloadError, match="does not exist"):
        build_workload(str(tmp_path / "missing.csv"))
    with pytest.raises(WorkloadError, match="groups applies to the mixed-64"):
        build_workload("chat", groups=2)
    for kw in ({"rate_scale": 0}, {"length_scale": -1.0}, {"max_requests": 0}):
        with pytest.raises(WorkloadError, match=next(iter(kw))):
            build_workload("chat", **kw)
    monkeypatch.setenv("METROLINE_TRACES", str(tmp_path / "nowhere"))
    with pytest.raises(WorkloadError, match="nowhere does not exist"):
        build_workload("azure-conv")
    monkeypatch.setenv("METROLINE_TRACES", str(TRACES))
    assert build_workload("azure-code", max_requests=2).params["path"] == str(TRACES / "azure_code_2023.csv")


# --- traces -----------------------------------------------------------------------------------


@needs_traces
def test_azure_conv_real_trace():
    w = build_workload("azure-conv", traces_dir=TRACES)
    assert len(w) == 19_366
    first, second = w.items[0], w.items[1]
    assert (first.arrival_s, first.prompt_len, first.output_len) == (0.0, 374, 44)
    assert (second.arrival_s, second.prompt_len, second.output_len) == (4.314579, 396, 109)
    assert len({it.segments for it in w.items[:1000]}) == 1000
    assert len(build_workload("azure-code", traces_dir=TRACES)) == 8_819


@needs_traces
def test_mooncake_real_trace_lengths():
    items = load_mooncake(TRACES / "mooncake_synthetic.jsonl")
    rows = [json.loads(line) for line in (TRACES / "mooncake_synthetic.jsonl").read_text().splitlines()]
    assert len(items) == len(rows) == 3_993
    by_arrival = sorted(rows, key=lambda r: r["timestamp"])
    assert [it.prompt_len for it in items] == [r["input_length"] for r in by_arrival]
    assert [it.output_len for it in items] == [r["output_length"] for r in by_arrival]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_mooncake_shared_blocks_share_exactly_their_tokens(tmp_path):
    rows = [
        {"timestamp": 5, "input_length": 1500, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 0, "input_length": 1400, "output_length": 4, "hash_ids": [1, 2, 9]},
        {"timestamp": 9, "input_length": 700, "output_length": 4, "hash_ids": []},
    ]
    path = write(tmp_path, "mc.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    b, a, c = load_mooncake(path)
    assert [it.arrival_s for it in (b, a, c)] == [0.0, 0.005, 0.009]
    assert [n for _, n in a.segments] == [512, 512, 476] and a.prompt_len == 1500
    assert [n for _, n in b.segments] == [512, 512, 376] and c.prompt_len == 700
    ta, tb = a.prompt_token_ids(), b.prompt_token_ids()
    common = next(i for i, (x, y) in enumerate(zip(ta, tb)) if x != y)
    assert common == 1024


def test_trace_rows_are_sorted_stably_and_made_relative(tmp_path):
    header = "num_decode_tokens,arrived_at,num_prefill_tokens,tenant,priority\n"
    path = write(tmp_path, "t.csv", header + "5,12.0,10,x,1\n6,10.5,11,,\n7,12.0,12,z,-2\n")
    items = load_azure(path)
    assert [(it.arrival_s, it.prompt_len, it.output_len, it.tenant, it.priority) for it in items] == [
        (0.0, 11, 6, "default", 0),
        (1.5, 10, 5, "x", 1),
        (1.5, 12, 7, "z", -2),
    ]


@needs_traces
def test_modifiers():
    base = build_workload("shared-prefix")
    fast = build_workload("shared-prefix", rate_scale=2.0)
    assert [f.arrival_s for f in fast] == pytest.approx([b.arrival_s / 2 for b in base])
    half = build_workload("shared-prefix", length_scale=0.5)
    assert {(it.prompt_len, it.output_len) for it in half} == {(516, 16)}
    toks = [it.prompt_token_ids() for it in half.items[:3]]
    assert toks[0][:500] == toks[1][:500] == toks[2][:500] == base.items[0].prompt_token_ids()[:500]
    tiny = build_workload("mixed-64", length_scale=0.01)
    assert {it.prompt_len for it in tiny} == {1} and {it.output_len for it in tiny} == {1, 20}
    first = build_workload("azure-conv", max_requests=10, traces_dir=TRACES)
    assert len(first) == 10
    assert first.items == build_workload("azure-conv", traces_dir=TRACES).items[:10]
    d = first.describe()
    assert (d["max_requests"], d["rate_scale"], d["length_scale"], d["requests"]) == (10, 1.0, 1.0, 10)


def test_workload_sorts_its_items_stably():
    items = [WorkloadItem(t, ((("w", i), 1),), 1) for i, t in enumerate([2.0, 1.0, 2.0, 0.5])]
    w = Workload("w", items)
    assert [it.segments[0][0][1] for it in w] == [3, 1, 0, 2]


HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (HEADER + "0.0,10,5\n0.5,abc,5\n", 3, "column num_prefill_tokens: expected an integer in [1, 16777216], got 'abc'"),
        (HEADER + "0.0,10,5\n0.5,10,0\n", 3, "column num_decode_tokens: expected an integer in [1, 16777216], got '0'"),
        (HEADER + "-1.0,10,5\n", 2, "column arrived_at: expected a number of seconds >= 0, got '-1.0'"),
        (HEADER + "nan,10,5\n", 2, "column arrived_at: expected a number of seconds >= 0, got 'nan'"),
        (HEADER + "0.0,10,5\n1.0,10\n", 3, "column num_decode_tokens: missing"),
        (HEADER + "0.0,10,5,7\n", 2, "4 fields, the header has 3"),
        (HEADER + "0.0,,5\n", 2, "column num_prefill_tokens: expected an integer in [1, 16777216], got ''"),
        (HEADER.strip() + ",priority\n0.0,1,5,high\n", 2, "column priority: expected an integer, got 'high'"),
        ("arrived_at,num_prefill_tokens\n0.0,10\n", 1, "missing column num_decode_tokens"),
    ],
)
def test_bad_azure_rows(tmp_path, text, line, message):
    path = write(tmp_path, "azure.csv", text)
    with pytest.raises(WorkloadError) as err:
        load_azure(path)
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert message in str(err.value)


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'


@pytest.mark.parametrize(
    ("line_text", "message"),
    [
        ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]', "malformed JSON"),
        ('{"timestamp": 1, "input_length": "600", "output_length": 5, "hash_ids": [1, 2]}',
         "key input_length: expected an integer in [1, 16777216], got '600'"),
        ('{"timestamp": 1, "input_length": 600, "output_length": true, "hash_ids": [1, 2]}',
         "key output_length: expected an integer in [1, 16777216], got True"),
        ('{"timestamp": -5, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
         "key timestamp: expected a number of milliseconds >= 0, got -5"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 0, "hash_ids": [1, 2]}',
         "key output_length: expected an integer in [1, 16777216], got 0"),
        ('{"timestamp": 1, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]}',
         "key hash_ids: 2 block ids of 512 tokens need input_length in [513, 1024], got 1100"),
        ('{"timestamp": 1, "input_length": 512, "output_length": 5, "hash_ids": [1, 2]}',
         "key hash_ids: 2 block ids"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1, "x"]}',
         "key hash_ids[1]: input should be a valid integer, got 'x'"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5}', "key hash_ids: missing"),
        ("[1, 2, 3]", "expected a JSON object"),
    ],
)
def test_bad_mooncake_rows(tmp_path, line_text, message):
    path = write(tmp_path, "mooncake.jsonl", GOOD + "\n" + line_text + "\n")
    with pytest.raises(WorkloadError) as err:
        build_workload(str(path))
    assert str(err.value).startswith(f"{path}:3: ")
    assert message in str(err.value)
