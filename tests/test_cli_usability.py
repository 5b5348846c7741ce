"""What a new user of the command meets: the `--debug` events on stderr, tagged with their policy,
times rounded; `compare` refusing the flags it cannot honour; help on every flag with its default;
paths in a config file taken from the file's folder."""

from __future__ import annotations

import argparse
import re

import pytest

from metroline import cli
from metroline.core.commands.flags import COMPARE_REFUSED
from metroline.core.config import EngineConfig, RunOptions

EVENT = re.compile(r"^(request\.\w+)\s+(.*)$")


def events(text: str) -> list[tuple[str, dict[str, str]]]:
    """The `--debug` lines of `text`: (event, {key: value})."""
    found = []
    for line in text.splitlines():
        m = EVENT.match(line)
        if m:
            found.append((m[1], dict(kv.split("=", 1) for kv in m[2].split())))
    return found


# --- the debug log ---------------------------------------------------------------------------------


def test_debug_events_go_to_stderr_with_the_policy_and_rounded_times(capsys):
    assert cli.main(["run", "--workload", "chat", "--max-requests", "30", "--policy", "srpt",
                     "--plugin", "decode_first", "--debug"]) == 0
    out, err = capsys.readouterr()
    assert not events(out) and "request." not in out  # stdout holds the report only
    logged = events(err)
    arrivals = [fields for name, fields in logged if name == "request.arrived"]
    assert len(arrivals) == 30  # one per request
    assert {fields["policy"] for _, fields in logged} == {"srpt+decode_first"}
    for _, fields in logged:
        t = fields["t"]
        assert float(t) == round(float(t), 6) and len(t.partition(".")[2]) <= 6, t  # not 0.10999999999999999
    assert all("error" not in fields for name, fields in logged if name == "request.finished")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_compare_tags_each_event_with_its_policy(capfd, jobs):
    # capfd: with 2 jobs the events come from forked worker processes, on file descriptor 2
    assert cli.main(["compare", "--policies", "fcfs,srpt+reserve", "--workload", "chat", "--max-requests", "20",
                     "--debug", "--jobs", jobs, "--no-progress"]) == 0
    out, err = capfd.readouterr()
    logged = events(err)
    assert not events(out)
    for policy in ("fcfs", "srpt+reserve"):
        arrivals = [f for name, f in logged if name == "request.arrived" and f["policy"] == policy]
        assert sorted(int(f["request_id"]) for f in arrivals) == list(range(20))
    assert {f["policy"] for _, f in logged} == {"fcfs", "srpt+reserve"}


# --- compare's refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(COMPARE_REFUSED))
def test_compare_refuses_what_it_cannot_honour(key, tmp_path, capsys):
    flag = "--" + key.replace("_", "-")
    value = str(tmp_path / "out.csv") if key.endswith("csv") else "srpt"
    assert cli.main(["compare", "--policies", "fcfs", "--max-requests", "5", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"metroline: error: {flag}: ") and err.count("\n") == 1
    assert "metroline run" in err or "--policies" in err  # says what to do instead
    assert not (tmp_path / "out.csv").exists()


def test_compare_help_hides_the_refused_flags():
    text = subparser("compare").format_help()
    assert "--policies" in text
    for key in COMPARE_REFUSED:
        assert "--" + key.replace("_", "-") + " " not in text


# --- help with defaults --------------------------------------------------------------------------


def subparser(name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


@pytest.mark.parametrize("command", ["run", "compare"])
def test_every_flag_has_help_with_its_default(command):
    for action in subparser(command)._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        assert action.help and "default" in action.help, action.option_strings


def test_the_defaults_shown_are_the_configs():
    helps = {a.dest: a.help for a in subparser("run")._actions}
    engine, run = EngineConfig(), RunOptions()
    for dest in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_blocks", "max_model_len",
                 "policy", "preemption_mode"):
        assert f"(default {getattr(engine, dest)})" in helps[dest], dest
    for dest in ("workload", "executor", "cost_model", "rate_scale", "length_scale", "window"):
        assert f"(default {getattr(run, dest)})" in helps[dest], dest
    # leaving --seed out is not --seed 0 for a trace (replayed as recorded) or a spec file (its own seed)
    assert "(default 0)" not in helps["seed"]
    assert f"sampling use seed {engine.seed}, a trace is replayed as recorded" in " ".join(helps["seed"].split())


def test_the_top_level_help_is_for_users(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "continuous-batching LLM inference scheduler" in out
    assert "metroline COMMAND --help" in out
    for internal in ("core/commands", "core/serving", "This module", "argparse"):
        assert internal not in out, internal


def test_a_run_under_a_preset_says_so_in_its_title(capsys):
    assert cli.main(["run", "--preset", "vllm", "--max-requests", "20", "--cost-model", "steps"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("metroline | policy fcfs | preset vllm | workload chat | executor sim")
    assert cli.main(["run", "--max-requests", "20", "--cost-model", "steps"]) == 0
    assert "preset" not in capsys.readouterr().out.splitlines()[0]


# --- paths in a config file ------------------------------------------------------------------------


def test_a_workload_path_in_a_config_file_is_relative_to_its_folder(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "tiny.toml").write_text("num_requests = 12\nprompt_len = 8\noutput_len = 4\n")
    (folder / "run.toml").write_text('[run]\nworkload = "tiny.toml"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # neither the config's folder nor one holding tiny.toml
    assert cli.main(["run", "--config", str(folder / "run.toml")]) == 0
    out = capsys.readouterr().out
    assert "workload tiny" in out and re.search(r"requests\s+12\s+completed\s+12\n", out)


def test_a_built_in_name_or_an_absolute_path_in_a_config_file_is_kept(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text("num_requests = 3\nprompt_len = 8\noutput_len = 4\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    for workload in ("mixed-64", str(spec)):
        (sub / "c.toml").write_text(f'[run]\nworkload = "{workload}"\n')
        args = cli.build_parser().parse_args(["run", "--config", str(sub / "c.toml")])
        _, run = cli.resolve_options(args)
        assert run["workload"] == workload
    (sub / "c.toml").write_text('[run]\nworkload = "data/w.csv"\ncost_params = { path = "steps.csv" }\n')
    _, run = cli.resolve_options(cli.build_parser().parse_args(["run", "--config", str(sub / "c.toml")]))
    assert run["workload"] == str(sub / "data" / "w.csv") and run["cost_params"]["path"] == str(sub / "steps.csv")


def test_a_flag_path_stays_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "c.toml").write_text('[run]\nworkload = "chat"\n')
    monkeypatch.chdir(tmp_path)
    args = cli.build_parser().parse_args(["run", "--config", "c.toml", "--workload", "w.csv"])
    assert cli.resolve_options(args)[1]["workload"] == "w.csv"


def test_a_single_engine_run_does_not_pass_through_the_cluster_code():
    """`run` without a cluster flag or table resolves its flags in one pass (`resolve_run`) to a
    spec without a cluster, and runs without the cluster command's module."""
    import subprocess
    import sys

    from metroline.core.commands.options import resolve_run

    spec = resolve_run(cli.build_parser().parse_args(["run", "--max-requests", "20"]))
    assert spec.cluster is None and not spec.names_workload and spec.file == {}
    assert resolve_run(cli.build_parser().parse_args(["run", "--replicas", "2"])).cluster.replicas == 2
    code = ("import contextlib, io, sys\nfrom metroline.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['run', '--workload', 'chat', '--max-requests', '20', '--cost-model', 'steps']) == 0\n"
            "print('metroline.core.commands.cluster_run' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
