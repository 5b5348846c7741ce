"""Fuzzing every input surface of the command (issue 7): arguments, config files (TOML, JSON) and
workload files (CSV, JSONL, spec). Whatever the input, `metroline` exits 0 with its table or 2 with
one `metroline: error: ...` line: no traceback, no hang, and memory under a fixed bound."""

from __future__ import annotations

import io
import json
import signal
import tempfile
import tracemalloc
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metroline import cli

MEMORY_BOUND = 128 * 2**20
"""Peak traced memory of one command (a run of 3 small requests needs a few MB)."""
HANG_S = 60
"""A command still running after this long is a hang (a normal one takes well under a second)."""

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TAIL = ["--max-requests", "3"]
"""Appended to every `run`: argparse keeps the last value, so runs stay small."""


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer in {HANG_S} s")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`metroline ARGV` in process, under the memory bound and the hang alarm."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    tracemalloc.start()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:
                code = exc.code
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert peak < MEMORY_BOUND, (argv, peak)
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> int:
    code, out, err = run_cli(argv)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.startswith("metroline: error: ") and err.count("\n") == 1, (argv, err)
        assert "internal error" not in err and "Traceback" not in err, (argv, err)
    else:  # stderr may hold a progress bar or the debug log
        assert "error" not in err and "Traceback" not in err, (argv, err)
    return code


# --- arguments ----------------------------------------------------------------------------------

FLAGS = [
    "--policy", "--plugin", "--max-num-seqs", "--max-batched-tokens", "--max-prefill-chunk", "--max-model-len",
    "--block-size", "--num-blocks", "--swap-space-blocks", "--preemption", "--seed", "--executor",
    "--cost-model", "--step-time", "--cost-param", "--rate-scale", "--length-scale", "--groups",
    "--window", "--oracle-lengths", "--no-prefix-sharing", "--debug", "--progress", "--no-progress",
    "--workload",
]
VALUES = st.one_of(
    st.sampled_from([
        "0", "-1", "1", "2", "3", "7", "16", "64", "1e-9", "1e308", "inf", "-inf", "nan", "99999999999999",
        "swap", "recompute", "fcfs", "srpt", "weighted_fair", "token_rr", "tenant_quota", "os.path",
        "json:loads", ".", "", "x=1", "step_time=inf", "gpu=H100", "steps", "roofline", "sim",
        "mixed-64", "shared-prefix", "nope.csv", "true", "false",
    ]),
    st.text(max_size=6),
)


@FUZZ
@given(st.sampled_from(["run", "compare", "plugins"]), st.lists(st.one_of(st.sampled_from(FLAGS), VALUES), max_size=8))
def test_any_arguments(command, words):
    argv = [command, *words]
    if command != "plugins":
        argv += ["--workload", "shared-prefix", *TAIL]
    if command == "compare":
        argv += ["--policies", "fcfs,srpt"]
    check(argv)


# --- config files -------------------------------------------------------------------------------

KEYS = [
    "block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_prefill_chunk", "max_model_len",
    "enable_prefix_caching", "preemption_mode", "swap_space_blocks", "policy", "plugins", "plugin_options",
    "seed", "debug", "run", "nope",
]
RUN_KEYS = list(cli.RUN_KEYS) + ["nope"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.sampled_from([2**63, 10**20, -(2**70)]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(["fcfs", "swap", "recompute", "false", "true", "tenant_quota", "os.path"]),
)
VALUES_DEEP = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=6)


def _toml_value(v) -> str:
    """A TOML rendering good enough for fuzzing (json's escapes are TOML's basic-string escapes;
    None has no TOML form and becomes a string)."""
    if v is None:
        return '"none"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(v), repr(v))
    if isinstance(v, (int, str)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


configs = st.fixed_dictionaries({}, optional={
    **{k: VALUES_DEEP for k in KEYS},
    "run": st.one_of(VALUES_DEEP, st.dictionaries(st.sampled_from(RUN_KEYS), VALUES_DEEP, max_size=4)),
})


@FUZZ
@given(configs, st.sampled_from(["toml", "json"]))
def test_any_config_file(data, fmt):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"c.{fmt}"
        if fmt == "json":
            path.write_text(json.dumps(data))
        else:
            path.write_text("".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in data.items()))
        check(["run", "--config", str(path), "--workload", "shared-prefix", *TAIL])


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(["toml", "json", "csv", "jsonl"]))
def test_any_bytes_as_config_or_workload(raw, fmt):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"f.{fmt}"
        path.write_bytes(raw)
        flag = "--config" if fmt in ("toml", "json") and len(raw) % 2 else "--workload"
        check(["run", flag, str(path), *(["--workload", "shared-prefix"] if flag == "--config" else []), *TAIL])


# --- workload files -----------------------------------------------------------------------------

CSV_COLUMNS = ["arrived_at", "num_prefill_tokens", "num_decode_tokens", "tenant", "priority", "extra", ""]
CELLS = st.one_of(
    st.sampled_from(["0", "1", "0.5", "-1", "1e300", "2000000000", "16777216", "nan", "inf", "", "a", "1.5", "1e-300"]),
    st.integers(-5, 50).map(str), st.text(max_size=5),
)


@FUZZ
@given(st.lists(st.sampled_from(CSV_COLUMNS), min_size=1, max_size=6), st.lists(st.lists(CELLS, max_size=7), max_size=5),
       st.booleans())
def test_any_csv_trace(header, rows, bom):
    text = ("\ufeff" if bom else "") + ",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.csv"
        path.write_text(text)
        check(["run", "--workload", str(path), *TAIL])


MOONCAKE = st.fixed_dictionaries({}, optional={
    "timestamp": st.one_of(st.integers(-1, 10**6), st.floats(), st.sampled_from([1e300, 0])),
    "input_length": st.one_of(st.integers(-1, 2000), st.sampled_from([2_000_000_000, 16777216]), st.text(max_size=3)),
    "output_length": st.one_of(st.integers(-1, 50), st.floats(), st.booleans()),
    "hash_ids": st.one_of(st.lists(st.integers(-3, 10), max_size=5), st.integers(), st.text(max_size=3)),
    "tenant": SCALARS, "priority": SCALARS,
})


@FUZZ
@given(st.lists(st.one_of(MOONCAKE, VALUES_DEEP), max_size=4))
def test_any_jsonl_trace(rows):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        check(["run", "--workload", str(path), *TAIL])


LENGTHS = st.one_of(
    st.integers(-2, 70), st.sampled_from([2**40, 16777216]),
    st.fixed_dictionaries({"dist": st.sampled_from(["fixed", "uniform", "lognormal", "zipf"])},
                          optional={"value": st.integers(-1, 40), "low": st.integers(-1, 40), "high": st.integers(-1, 40),
                                    "mean": st.floats(), "sigma": st.floats(), "min": st.integers(-1, 9),
                                    "max": st.integers(-1, 99)}),
    SCALARS,
)
SPECS = st.fixed_dictionaries({}, optional={
    "num_requests": st.one_of(st.integers(-1, 6), st.sampled_from([100_000_000, 10**30]), SCALARS),
    "rate": st.one_of(st.floats(), st.sampled_from([1e-300, 5e-324, 1e300])),
    "arrival": st.sampled_from(["poisson", "gamma", "x"]),
    "burstiness": st.floats(),
    "prompt_len": LENGTHS, "output_len": LENGTHS,
    "tenants": st.dictionaries(st.text(max_size=3), st.one_of(st.floats(), st.integers()), max_size=3),
    "priorities": st.dictionaries(st.text(max_size=3), st.floats(), max_size=2),
    "shared_prefix_len": st.integers(-1, 40), "num_prefixes": st.integers(-1, 4), "seed": SCALARS,
    "nope": SCALARS,
})


@FUZZ
@given(SPECS)
def test_any_workload_spec(spec):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.json"
        path.write_text(json.dumps(spec))
        check(["run", "--workload", str(path), *TAIL])
