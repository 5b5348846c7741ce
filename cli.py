"""The `metroline` command: `run` a workload under a policy, `compare` policies, `generate` text with
a real model, `calibrate` the simulator against it, list `plugins` and `workloads`, `serve` HTTP,
`sweep` policies across arrival rates, `replay` a result document, `plot` result documents, fetch the public `traces`.

This module parses the command line (argparse) and calls the command's body in `core/commands/`."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from .core.commands.calibrate import cmd_calibrate
from .core.commands.canary_report import cmd_canary_report
from .core.commands.check_plugin import add_check_plugin_parser, cmd_check_plugin
from .core.commands.compare import POLICIES, add_statistics_flags, cmd_compare
from .core.commands.flags import (
    calibrate_flags,
    cluster_flags,
    engine_flags,
    generate_flags,
    ray_flag,
    run_flags,
    serve_flags,
    slo_flag,
    sweep_flags,
)
from .core.commands.generate import cmd_generate
from .core.commands.listing import cmd_plugins, cmd_workloads
from .core.commands.options import RUN_KEYS, fit_config, resolve_options
from .core.commands.plot import add_plot_parser, cmd_plot
from .core.commands.replay import cmd_replay
from .core.commands.run import cmd_run
from .core.commands.serve import cmd_serve
from .core.commands.sweep import add_seed_flags, cmd_sweep
from .core.commands.traces import add_traces_parser, cmd_traces

__all__ = ["POLICIES", "RUN_KEYS", "build_parser", "fit_config", "main", "resolve_options"]


DESCRIPTION = ("metroline: a continuous-batching LLM inference scheduler whose policy is made of plugins. "
               "Simulate workloads under policies (run, compare, sweep), generate text with a real model, "
               "serve an OpenAI-compatible API, and check your own plugins (check-plugin).")
"""What `metroline --help` says of the command (the module's docstring is for readers of the code)."""
EPILOG = ("Each command's flags and their defaults: metroline COMMAND --help. "
          "The user guide is docs/index.md in the source repository.")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in metroline's one-line style."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):
            message = message[len("argument "):]
        self.exit(2, f"metroline: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command and its flags."""
    parser = _Parser(prog="metroline", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="simulate a workload under a policy and print its metrics")
    engine_flags(run)
    run_flags(run)
    cluster_flags(run)
    run.add_argument("--outputs", metavar="PATH", help="write one JSON line per finished sequence: id, "
                     "prompt_token_ids, output_token_ids, text (null without a tokenizer), finish_reason (default: none)")
    compare = sub.add_parser("compare", help="run several policies on the identical workload, side by side")
    compare.add_argument("--policies",
                         help="comma-separated policies; `a+b` stacks plugin b on policy a "
                         f"(default: {','.join(POLICIES)}; with --routers the config's policy)")
    compare.add_argument("--routers", metavar="R1,R2,...",
                         help="compare routers instead of policies, each on the simulated cluster of --replicas, "
                         "--pools or [cluster]; `name:key=value` gives that router an option (default: none)")
    compare.add_argument("--seeds", type=int, metavar="K",
                         help="run every policy on K draws of the workload (seeds --seed, --seed + 1, ...; "
                         "a trace is resampled, see --resample) and print each metric's mean with its 95%% "
                         "interval and each policy's paired difference from the baseline with a verdict (default: one run "
                         "of the workload, no intervals)")
    compare.add_argument("--baseline", metavar="NAME",
                         help="with --seeds: the policy the others are compared with (default: the first of --policies)")
    compare.add_argument("--jobs", type=int, metavar="N",
                         help="worker processes running the policies in parallel (default: one per core; "
                         "1 runs them one by one here); the results do not depend on it")
    add_statistics_flags(compare)
    ray_flag(compare)
    engine_flags(compare, compare=True)
    run_flags(compare, compare=True)
    cluster_flags(compare)
    slo_flag(compare)
    sweep = sub.add_parser("sweep", help="run policies across arrival rates: SLO attainment, goodput, capacity at SLO")
    sweep.add_argument("--policies", default=",".join(POLICIES),
                       help=f"comma-separated policies, as for compare (default: {','.join(POLICIES)})")
    sweep.add_argument("--jobs", type=int, metavar="N", help="worker processes (default: one per core)")
    ray_flag(sweep)
    engine_flags(sweep, compare=True)
    run_flags(sweep, compare=True)
    sweep_flags(sweep)
    add_seed_flags(sweep)
    replay = sub.add_parser("replay", help="rerun a result document's command (its manifest) and say whether "
                            "the result matches")
    replay.add_argument("file", metavar="FILE", help="a result document written with --json")
    plugins = sub.add_parser("plugins", help="list the loaded plugins, the hooks each implements and their options")
    engine_flags(plugins)
    sub.add_parser("workloads", help="list the built-in workloads")
    serve = sub.add_parser("serve", help="serve the engine behind an OpenAI-compatible HTTP API")
    engine_flags(serve)
    serve_flags(serve)
    cluster_flags(serve, serving=True)
    canary = sub.add_parser("canary-report", help="a canary's arms compared: TTFT/TPOT percentiles with intervals "
                            "and a verdict, from a serving front or a run's result document")
    canary.add_argument("source", metavar="SOURCE", help="http://HOST:PORT of `serve --replicas` (its /v1/canary), "
                        "a result document of `run --json` with a canary, or a saved /v1/canary answer")
    canary.add_argument("--level", type=float, default=0.95, help="the intervals' confidence level (default 0.95)")
    canary.add_argument("--json", metavar="PATH", help="write the comparisons (default: none)")
    canary.add_argument("--fail-on-worse", action="store_true",
                        help="exit 1 when a canary is worse (for a rollout script; default: exit 0)")
    generate = sub.add_parser("generate", help="generate text from prompts with a real model, streamed")
    generate_flags(generate)
    calibrate = sub.add_parser("calibrate", help="time a real model over batch shapes and fit the simulator's "
                               "cost model to it (--cost-model calibrated --cost-param path=FILE)")
    calibrate_flags(calibrate)
    add_check_plugin_parser(sub)
    add_traces_parser(sub)
    add_plot_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's), run the command (default `run`) and return its exit
    status; an error is one line on stderr, `metroline: error: ...`, and status 2."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        argv = ["run"]
    args = parser.parse_args(argv)
    args.argv = list(argv)  # for the manifest of a result document
    from .core.diagnostics import validation_message
    from .core.errors import NoProgressError, PluginError
    from .core.plugins.deprecations import show_in_cli

    from .core.results.progress import new_command

    show_in_cli()  # a plugin's use of a deprecated name is shown (once per plugin and name)
    new_command()  # progress lines: the interval starts with the command

    try:
        return COMMANDS[args.command or "run"](args)
    except ValidationError as exc:
        message = validation_message(exc, lambda key: exc.title)
    except (ValueError, PluginError, NoProgressError, OSError) as exc:
        message = str(exc)
    except MemoryError:
        message = "out of memory (lower the workload size or the pool)"
    except RecursionError:
        message = "input nested too deeply"
    except Exception as exc:  # a bug, not the input's fault: still one line, and says so
        message = f"internal error {type(exc).__name__}: {exc} (please report it with the command line)"
    print(f"metroline: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def rerun(argv: list[str], out: Path) -> None:
    """Run the command line `argv` (a manifest's) again, its result document to `out` and its
    other outputs (tables, report, CSVs, progress) left out; errors propagate."""
    args = build_parser().parse_args(argv)
    for key in ("report", "requests_csv", "steps_csv", "outputs"):
        if hasattr(args, key):
            setattr(args, key, None)
    args.json, args.progress, args.argv = str(out), False, list(argv)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        COMMANDS[args.command or "run"](args)


COMMANDS = {"run": cmd_run, "compare": cmd_compare, "sweep": cmd_sweep, "plugins": cmd_plugins,
            "workloads": cmd_workloads, "serve": cmd_serve, "generate": cmd_generate, "calibrate": cmd_calibrate,
            "check-plugin": cmd_check_plugin, "canary-report": cmd_canary_report, "traces": cmd_traces,
            "plot": cmd_plot,
            "replay": lambda args: cmd_replay(args, rerun)}
"""The body of each command."""


if __name__ == "__main__":
    sys.exit(main())
