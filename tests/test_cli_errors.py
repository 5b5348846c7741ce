"""Every bad input is refused by name, on one line, with no traceback; extreme inputs run in bounded
memory (issue 7, findings 8-10, 12 and 13)."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout

import pytest

from metroline import cli
from metroline.core.config import MAX_BLOCKS
from metroline.core.results.metrics import fairness
from metroline.core.workloads.build import MAX_ITEM_TOKENS, MAX_REQUESTS, WorkloadError, build_workload

PREFIX = "metroline: error: "


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`metroline ARGV` in process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def refused(argv: list[str], *fragments: str) -> str:
    """Run `argv`, expecting exit code 2 and one error line that holds every fragment."""
    code, out, err = run_cli(argv)
    assert code == 2, (out, err)
    assert err.startswith(PREFIX) and err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.fixture
def csv_file(tmp_path):
    def write(text: str, name: str = "w.csv", raw: bytes | None = None):
        path = tmp_path / name
        if raw is not None:
            path.write_bytes(raw)
        else:
            path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def small(csv_file):
    return csv_file("arrived_at,num_prefill_tokens,num_decode_tokens,tenant\n0,10,5,a\n0.5,12,3,b\n")


def config_file(tmp_path, text: str, name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# --- finding 10: tracebacks --------------------------------------------------------------------


@pytest.mark.parametrize("text, fragments", [
    ("[run]\ncost_params = 5\n", ["c.toml: run: cost_params: must be a table of cost model parameters, got 5"]),
    ('[run]\nmax_requests = "ten"\n', ["c.toml: run: max_requests: input should be a valid integer, got 'ten'"]),
    ("run = 5\n", ["c.toml: run: must be a table of run options (valid: workload,"]),
    ("[run]\nworkload = 5\n", ["c.toml: run: workload: input should be a valid string, got 5"]),
    ('[run]\noracle_lengths = "false"\n', ["c.toml: run: oracle_lengths: input should be a valid boolean, got 'false'"]),
    ("max_num_seqs = true\n", ["c.toml: max_num_seqs: input should be a valid integer, got True"]),
    ("policy = 5\n", ["c.toml: policy: input should be a valid string, got 5"]),
    ("[plugin_options.tenant_quta]\nx = 1\n", ["plugin_options.tenant_quta: no plugin 'tenant_quta' is loaded (loaded: fcfs)"]),
    ("num_blocks = 99999999999999\n", [f"c.toml: num_blocks: input should be less than or equal to {MAX_BLOCKS}"]),
    ("[run]\nstep_time = inf\n", ["c.toml: run: step_time: input should be a finite number, got inf"]),
    ("block_size = = 3\n", ["c.toml: invalid TOML: "]),
], ids=["cost_params", "max_requests", "run", "workload", "oracle_lengths", "max_num_seqs", "policy",
        "plugin_options", "num_blocks", "step_time", "syntax"])
def test_a_bad_config_file_is_one_line_naming_file_and_key(tmp_path, small, text, fragments):
    # a flag would override the key under test: give the workload by flag unless it is that key
    rest = [] if "workload" in text else ["--workload", small]
    refused(["run", "--config", config_file(tmp_path, text), *rest], *fragments)


def test_a_json_config_names_the_line(tmp_path, small):
    path = config_file(tmp_path, '{\n  "block_size": 4,\n  "num_blocks": ,\n}\n', "c.json")
    refused(["run", "--workload", small, "--config", path], "c.json:3: invalid JSON: Expecting value")


@pytest.mark.parametrize("argv, fragments", [
    (["--num-blocks", "99999999999999"], [f"--num-blocks: num_blocks: input should be less than or equal to {MAX_BLOCKS}"]),
    (["--swap-space-blocks", "99999999999999"], ["--swap-space-blocks: swap_space_blocks: input should be less than"]),
    (["--num-blocks", "x"], ["--num-blocks: invalid int value: 'x'"]),
    (["--max-num-seqs", "0"], ["--max-num-seqs: max_num_seqs: input should be greater than or equal to 1, got 0"]),
    (["--step-time", "inf"], ["--step-time: step_time: input should be a finite number, got inf"]),
    (["--window", "nan"], ["--window: window: input should be a finite number, got nan"]),
    (["--rate-scale", "0"], ["--rate-scale: rate_scale: input should be greater than 0"]),
    (["--cost-param", "step_time=inf"], ["--cost-param: cost_params: step_time must be a finite number, got inf"]),
    (["--cost-param", "novalue"], ["--cost-param: 'novalue': expected KEY=VALUE"]),
    (["--policy", "os.path"], ["plugin 'os.path': module 'posixpath' has no metroline hook"]),
    (["--policy", "json:loads"], ["plugin 'json:loads': function 'loads' has no metroline hook"]),
    (["--policy", "."], ["unknown plugin '.'"]),
    (["--plugin", "collections:OrderedDict"], ["plugin 'collections:OrderedDict': class 'OrderedDict' has no metroline hook"]),
    (["--preemption", "swap", "--swap-space-blocks", "0"], ["--preemption: preemption_mode: preemption_mode='swap' needs swap_space_blocks >= 1"]),
    (["--max-prefill-chunk", "4096"], ["max_prefill_chunk (4096) must not exceed max_num_batched_tokens (2048)"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_flag_is_one_line_naming_the_flag(small, argv, fragments):
    refused(["run", "--workload", small, *argv], *fragments)


def test_a_plugin_module_that_cannot_import_is_one_line(tmp_path, small, monkeypatch):
    (tmp_path / "mtl_cli_broken.py").write_text("def oops(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        refused(["run", "--workload", small, "--plugin", "mtl_cli_broken:P"], "importing 'mtl_cli_broken' raised SyntaxError")
    finally:
        sys.modules.pop("mtl_cli_broken", None)


def test_no_progress_is_one_line(tmp_path, small, monkeypatch):
    (tmp_path / "mtl_never.py").write_text(textwrap.dedent('''
        from metroline.core.plugins.hookspecs import hookimpl

        class Never:
            name = "never"

            @hookimpl
            def admission(self, ctx):
                return []
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        refused(["run", "--workload", small, "--plugin", "mtl_never:Never"], "steps scheduled nothing", "never")
    finally:
        sys.modules.pop("mtl_never", None)


# --- finding 12: silent wrong results ------------------------------------------------------------


def test_swap_space_blocks_zero_means_zero():
    args = cli.build_parser().parse_args(["run", "--swap-space-blocks", "0"])
    config, _ = cli.resolve_options(args)
    assert config.swap_space_blocks == 0
    args = cli.build_parser().parse_args(["run", "--preemption", "swap", "--num-blocks", "32"])
    config, _ = cli.resolve_options(args)
    assert config.swap_space_blocks == 32  # not given: as many as the device pool


def test_a_duplicated_csv_column_is_an_error(csv_file):
    path = csv_file("arrived_at,num_prefill_tokens,num_decode_tokens,num_decode_tokens\n0,10,5,7\n")
    refused(["run", "--workload", path], f"{path}:1: column num_decode_tokens appears twice")


# --- finding 13: unclear errors -----------------------------------------------------------------


def test_a_utf8_bom_is_not_part_of_the_header(csv_file):
    path = csv_file("", raw="\ufeffarrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n".encode())
    assert [it.output_len for it in build_workload(path)] == [5]


def test_a_file_that_is_not_utf8_is_named_with_its_line(csv_file, tmp_path):
    path = csv_file("", raw=b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n0,\xff\xfe,5\n")
    refused(["run", "--workload", path], f"{path}:3: not UTF-8 text")
    spec = tmp_path / "spec.toml"
    spec.write_bytes(b"num_requests = 2\nprompt_len = 8\n# \xff\noutput_len = 4\n")
    refused(["run", "--workload", str(spec)], f"{spec}:3: not UTF-8 text")
    config = tmp_path / "c.toml"
    config.write_bytes(b"block_size = 4\n\xc3\x28 = 1\n")
    refused(["run", "--config", str(config)], f"{config}:2: not UTF-8 text")


def test_tenant_shares_are_validated_with_the_limit(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"num_requests": 2, "prompt_len": 8, "output_len": 4,
                                "tenants": {"a": 1e308, "b": 1e308}}))
    refused(["run", "--workload", str(spec)], "tenants.a: Input should be less than or equal to 1000000000000")


def test_json_into_a_missing_folder_is_an_error(small, tmp_path):
    target = tmp_path / "nope" / "doc.json"
    refused(["run", "--workload", small, "--json", str(target)], f"--json: {target}: the folder {target.parent} does not exist")
    assert not target.parent.exists()


# --- findings 8 and 9: bounded memory on extreme input ----------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--window", "1e-7"], ["--rate-scale", "1e-9"], ["--step-time", "1e6"], ["--step-time", "1e6", "--window", "1e-3"],
], ids=" ".join)
def test_extreme_clocks_run_in_windows_that_follow_the_records(csv_file, argv, tmp_path):
    path = csv_file("arrived_at,num_prefill_tokens,num_decode_tokens\n1700000000,10,5\n1700000000,10,3\n1700000001,4,2\n")
    doc_path = tmp_path / "doc.json"
    code, out, err = run_cli(["run", "--workload", path, "--json", str(doc_path), *argv])
    assert (code, err) == (0, "")
    doc = json.loads(doc_path.read_text())
    assert doc["summary"]["completed"] == 3
    windows = doc["fairness"]["windows"]
    # windows hold what happened: at most a start and an end of a wait per request, and one window
    # per token and per prefill (3 requests, 10 tokens)
    assert 1 <= len(windows) <= 3 * 2 + 10 + 3
    assert sum(sum(w["output"].values()) for w in windows) == 10


def test_fairness_of_two_requests_a_day_apart_in_microsecond_windows():
    from metroline.core.results.metrics import RequestRecord

    def rec(rid, t):
        return RequestRecord(rid, rid, 0, t, t, t, t, t + 1.0, 4, 0, 2, 0, 0, "length", (t, t + 1.0), None)

    f = fairness([rec("a", 0.0), rec("b", 86400.0)], window_s=1e-6)
    assert len(f["windows"]) == 4  # each request's two tokens (its wait starts and ends with the first)
    assert [sum(w["output"].values()) for w in f["windows"]] == [1, 1, 1, 1]
    assert f["max_service_gap"] == 0.0


def test_a_huge_prompt_row_is_refused_before_it_is_made(csv_file):
    path = csv_file(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,2000000000,5\n")
    refused(["run", "--workload", path], f"{path}:2: column num_prefill_tokens: expected an integer in [1, {MAX_ITEM_TOKENS}], got '2000000000'")


def test_a_long_but_valid_row_is_rejected_without_building_its_prompt(csv_file, tmp_path):
    import tracemalloc

    path = csv_file(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,{MAX_ITEM_TOKENS},5\n0,10,2\n")
    doc_path = tmp_path / "doc.json"
    tracemalloc.start()
    try:
        code, out, err = run_cli(["run", "--workload", path, "--json", str(doc_path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (code, err) == (0, "")
    assert peak < 64 * 2**20  # the 16M-token prompt (about 1 GB as a list) was never made
    summary = json.loads(doc_path.read_text())["summary"]
    assert (summary["rejected"], summary["completed"]) == (1, 1)


@pytest.mark.parametrize("argv, fragment", [
    (["--workload", "mixed-64", "--groups", "99999999999999"], f"groups must be in [1, {MAX_REQUESTS // 64}]"),
    (["--workload", "mixed-64", "--groups", "0"], "--groups: groups: input should be greater than or equal to 1"),
])
def test_huge_counts_are_refused_before_allocation(argv, fragment):
    refused(["run", *argv], fragment)


def test_a_spec_of_too_many_requests_is_refused(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text("num_requests = 100000000\nprompt_len = 8\noutput_len = 4\n")
    refused(["run", "--workload", str(spec)], f"num_requests: Input should be less than or equal to {MAX_REQUESTS}")


def test_a_rate_that_overflows_the_clock_is_refused(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text("num_requests = 3\nprompt_len = 8\noutput_len = 4\nrate = 5e-324\n")
    refused(["run", "--workload", str(spec)], "rate 5e-324: arrivals overflow the clock")


def test_a_tiny_rate_runs(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text("num_requests = 3\nprompt_len = 8\noutput_len = 4\nrate = 1e-300\n")
    code, out, err = run_cli(["run", "--workload", str(spec)])
    assert (code, err) == (0, "")


def test_a_mooncake_timestamp_of_1e300_runs(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]},
            {"timestamp": 1e300, "input_length": 10, "output_length": 3, "hash_ids": [2]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_cli(["run", "--workload", str(path)])
    assert (code, err) == (0, "")


def test_scales_that_overflow_are_refused(small):
    with pytest.raises(WorkloadError, match="rate_scale 1e-309: the arrival at 0.5 s overflows the clock"):
        build_workload(small, rate_scale=1e-309)  # 0.5 / 1e-309 is above the largest float
    with pytest.raises(WorkloadError, match=f"length_scale 1e\\+07: a length of 12 tokens would become 1.2e\\+08, above the limit of {MAX_ITEM_TOKENS}"):
        build_workload(small, length_scale=1e7)


def test_a_token_rate_of_1e_minus_300_runs(tmp_path, small):
    config = config_file(tmp_path, """
        plugins = ["tenant_quota"]
        [plugin_options.tenant_quota]
        default_token_rate = 1e-300
    """)
    doc_path = tmp_path / "doc.json"
    code, out, err = run_cli(["run", "--workload", small, "--config", config, "--json", str(doc_path)])
    assert (code, err) == (0, "")
    doc = json.loads(doc_path.read_text())
    # a bucket starts full (one second of its rate: 1e-300 tokens) and a prompt longer than the
    # burst passes a full bucket: each tenant's one request runs; the generated tokens drive the
    # buckets to about -5 tokens, so a next admission would wait ~5e300 s
    assert doc["summary"]["completed"] == 2
    assert len(doc["fairness"]["windows"]) <= 2 * 2 + 8 + 2
