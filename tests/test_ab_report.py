"""`--report DIR`: the files are written, the plots have labelled axes with units and one colour
per policy in every plot (read through matplotlib's objects, not pixels), the tables show
intervals and verdicts when the documents carry them."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("matplotlib")

from metroline.core.ab_report import plots, write_compare_report, write_sweep_report  # noqa: E402
from metroline.core.ab_report.document import to_html, to_markdown  # noqa: E402
from metroline.core.ab_report.tables import comparison_table, figure, verdict_table  # noqa: E402
from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.experiments.parallel import run_many  # noqa: E402
from metroline.core.experiments.run_series import series_of  # noqa: E402
from metroline.core.experiments.sweep import Sweep  # noqa: E402
from metroline.core.workloads.build import build_workload  # noqa: E402
from metroline.executors.registry import make_executor  # noqa: E402

LABELS = ["fcfs", "srpt"]


def sim():
    return make_executor("sim", cost_model="steps")


@pytest.fixture(scope="module")
def compared():
    workload = build_workload("chat", max_requests=150)
    configs = [EngineConfig(policy=p, max_num_seqs=16, num_blocks=600) for p in LABELS]
    runs = run_many([(workload, c) for c in configs], sim, extract=series_of, jobs=1)
    docs = [doc for doc, _ in runs]
    return {"runs": docs}, [s for _, s in runs]


def line_colours(fig) -> dict[str, tuple]:
    """{legend label: colour} of the lines of a figure's first panel."""
    return {line.get_label(): line.get_color() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}


def test_a_comparison_report_writes_its_files(tmp_path, compared):
    doc, series = compared
    folder = write_compare_report(tmp_path / "rep", doc, LABELS, series)
    for name in ("report.md", "report.html", "result.json", "cdf_ttft.png", "cdf_tpot.png", "cdf_e2e.png",
                 "engine_over_time.png", "tenant_service.png"):
        assert (folder / name).stat().st_size > 0, name
    for name in ("cdf_ttft.png", "engine_over_time.png"):
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((folder / "result.json").read_text()) == doc
    for label, s in zip(LABELS, series):  # one row per request record
        rows = list(csv.DictReader((folder / "requests" / f"{label}.csv").open()))
        assert len(rows) == len(s.records) == 150
    md, page = (folder / "report.md").read_text(), (folder / "report.html").read_text()
    for text in (md, page):  # every plot is shown, every policy is a column
        for png in ("cdf_ttft.png", "cdf_tpot.png", "cdf_e2e.png", "engine_over_time.png", "tenant_service.png"):
            assert png in text
        assert "TTFT p99 (ms)" in text and "srpt" in text


def test_plots_have_labelled_axes_with_units_and_one_colour_per_policy(tmp_path, compared):
    _, series = compared
    by_label = dict(zip(LABELS, series))
    palette = plots.colours(LABELS)
    assert len(set(palette.values())) == len(LABELS)
    figs = {m: plots.latency_cdf(by_label, m, tmp_path / f"{m}.png", palette) for m in ("ttft", "tpot", "e2e")}
    for metric, fig in figs.items():
        ax = fig.axes[0]
        assert ax.get_xlabel().endswith("(s)") and metric.upper() in ax.get_xlabel()
        assert ax.get_ylabel() == "fraction of completed requests"
        ys = [line.get_ydata() for line in ax.get_lines()]
        assert all(y[-1] == pytest.approx(1.0) for y in ys)  # a CDF ends at 1
    engine = plots.engine_over_time(by_label, tmp_path / "engine.png", palette)
    assert [ax.get_ylabel() for ax in engine.axes] == [
        "queue length (requests)", "batch size (sequences)", "KV blocks in use (%)"]
    assert engine.axes[-1].get_xlabel() == "time since the first arrival (s)"
    tenants = plots.tenant_service(by_label, tmp_path / "tenants.png", palette)
    assert {ax.get_title() for ax in tenants.axes} == {"tenant alpha", "tenant beta", "tenant gamma"}
    assert all(ax.get_ylabel() == "service (tokens/s)" for ax in tenants.axes)
    for fig in [*figs.values(), engine, tenants]:  # the same colour for a policy in every plot
        assert line_colours(fig) == {label: palette[label] for label in LABELS}


def test_the_series_integrate_to_the_run_totals(compared):
    doc, series = compared
    for d, s in zip(doc["runs"], series):
        # time-weighted over bins of equal width, steps of equal length (steps cost model): the
        # bins' mean over the busy time equals the per-step mean batch size
        busy = d["summary"]["steps"] * 0.01
        assert sum(s.batch) * s.bin_s / busy == pytest.approx(d["summary"]["mean_batch_size"], rel=1e-9)
        # the per-tenant service integrates to the tokens each tenant was served
        for tenant, row in s.tenant_service.items():
            served = sum(r.prompt_tokens - r.cached_prompt_tokens + r.output_tokens for r in s.records if r.tenant == tenant)
            assert sum(row) * s.bin_s == pytest.approx(served, rel=1e-9)


def test_a_sweep_report_draws_load_plots(tmp_path):
    workload = build_workload("chat", max_requests=120)
    sweep = Sweep(workload, LABELS, [EngineConfig(policy=p, max_num_seqs=16) for p in LABELS], sim,
                  {"ttft": 0.5}, jobs=1)
    rates = [20.0, 60.0]
    doc = sweep.document(sweep.over_rates(rates), "rates", None)
    folder = write_sweep_report(tmp_path / "sw", doc, sweep.series)
    for name in ("goodput_vs_load.png", "latency_vs_load.png", "cdf_ttft.png", "points.csv", "report.html"):
        assert (folder / name).stat().st_size > 0, name
    assert len(list((folder / "requests").glob("*.csv"))) == len(LABELS) * len(rates)
    palette = plots.colours(LABELS)
    fig = plots.goodput_vs_load(doc, tmp_path / "g.png", palette)
    assert [ax.get_ylabel() for ax in fig.axes] == ["goodput (requests/s within SLO)", "SLO attainment (% of requests)"]
    assert fig.axes[-1].get_xlabel() == "offered load (requests/s)"
    assert line_colours(fig) == {label: palette[label] for label in LABELS}
    lat = plots.latency_vs_load(doc["points"], tmp_path / "l.png", palette)
    assert [ax.get_ylabel() for ax in lat.axes] == ["TTFT p50 (s)", "TTFT p99 (s)", "TPOT p50 (ms)", "E2E p99 (s)"]
    assert [ax.get_xlabel() for ax in lat.axes[2:]] == ["offered load (requests/s)"] * 2


def test_intervals_and_verdicts_are_shown_when_present():
    summary = {"ttft_s": {"mean": 0.2, "p99": 0.9, "ci": {"mean": {"low": 0.15, "high": 0.25}}},
               "output_throughput_tok_s": 1000.0, "ci": {"output_throughput_tok_s": {"low": 990.0, "high": 1010.0}}}
    assert figure(summary, "ttft_s", "mean", "ms") == "200 [150, 250]"
    assert figure(summary, "ttft_s", "p99", "ms") == "900"  # no interval for p99: none shown
    assert figure({"e2e_s": {"mean": 15.4216}}, "e2e_s", "mean", "ms") == "15,422"
    assert figure(summary, "output_throughput_tok_s", None, "num") == "1000 [990, 1010]"
    paired = {"ttft_s.mean": {"difference": {"estimate": 0.05, "low": 0.01, "high": 0.09},
                              "relative": {"estimate": 0.25, "low": 0.05, "high": 0.45}, "verdict": "worse"}}
    docs = [{"summary": summary, "policy": "a"}, {"summary": summary, "policy": "b", "baseline": "a", "paired": paired}]
    table = verdict_table(docs, ["a", "b"])
    assert table.rows == [["b", "a", "ttft_s.mean", "0.05 [0.01, 0.09]", "25.0% [5.0%, 45.0%]", "worse"]]
    assert verdict_table([{"summary": summary}], ["a"]) is None
    md, page = to_markdown([table]), to_html([table], "t")
    assert "| b | a | ttft_s.mean |" in md and "<td>worse</td>" in page
    full = {k: None for k in ("requests", "completed")}
    assert comparison_table([{"summary": {**summary, **full}}], ["a"]).rows[4][1] == "200 [150, 250]"


def test_run_and_compare_write_a_report_from_the_command_line(tmp_path, capsys):
    from metroline import cli

    argv = ["--workload", "chat", "--max-requests", "80", "--max-num-seqs", "16", "--cost-model", "steps", "--no-progress"]
    assert cli.main(["run", *argv, "--report", str(tmp_path / "one")]) == 0
    assert cli.main(["compare", "--policies", "fcfs,srpt", "--jobs", "2", *argv, "--slo", "ttft=1",
                     "--report", str(tmp_path / "two")]) == 0
    assert f"report: {tmp_path / 'two' / 'report.html'}" in capsys.readouterr().out
    for folder, labels in ((tmp_path / "one", ["fcfs"]), (tmp_path / "two", LABELS)):
        assert all((folder / f"{name}.png").stat().st_size > 0 for name in ("cdf_ttft", "engine_over_time"))
        assert sorted(p.stem for p in (folder / "requests").glob("*.csv")) == labels
        doc = json.loads((folder / "result.json").read_text())
        assert doc["manifest"]["command"]["argv"][0] in ("run", "compare")
    two = json.loads((tmp_path / "two" / "result.json").read_text())
    assert all(run["slo"]["bounds"] == {"ttft": 1.0} for run in two["runs"])
    assert "SLO attainment" in (tmp_path / "two" / "report.md").read_text()


def test_a_report_folder_that_is_a_file_is_refused_before_the_run(tmp_path, capsys):
    from metroline import cli

    taken = tmp_path / "taken"
    taken.write_text("")
    assert cli.main(["run", "--workload", "chat", "--max-requests", "5", "--report", str(taken)]) == 2
    assert f"--report: {taken} is a file, not a folder" in capsys.readouterr().err
