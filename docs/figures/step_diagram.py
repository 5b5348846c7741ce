"""Draw one engine step and the hook points it calls: `docs/_static/step.svg`, the picture of the
README and of the concepts page.

    python docs/figures/step_diagram.py            # writes docs/_static/step.svg (needs matplotlib)
    python docs/figures/step_diagram.py --check    # the phases name every hook of the step protocol, in its order

The phases and the hooks under each are the table `PHASES` below; `check()` holds it to the step
protocol of `metroline.core.plugins.hookspecs` (`STEP_PROTOCOL`, the order the tests check every
step against), so a hook added to the step and left out of the picture fails
`tests/test_step_diagram.py`. The hooks outside the step are `OUTSIDE`, held to the hookspecs'
hooks (`metroline.api.HOOK_NAMES`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "_static" / "step.svg"

# (phase, what it does, hooks it calls in the step protocol's order)
PHASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("arrive", "requests whose time\nhas come join waiting", ("on_arrival",)),
    ("split", "the token budget:\ndecode, prefill,\ntenant shares", ("split_budget",)),
    ("serve running", "decode token or next\nprefill chunk; victims\nwhen blocks run out",
     ("num_draft_tokens", "order_running", "select_victim", "on_preempted")),
    ("admit", "waiting requests pulled\nlazily until slots or\nbudget run out", ("admission", "select_victim", "on_preempted")),
    ("fork, plan", "n > 1 samples fork;\nthe StepPlan: tokens,\nblock tables, block ops", ("on_admitted",)),
    ("execute", "executor: a cost model\n(simulated) or a model\n(torch) on paged KV", ()),
    ("sample", "logits to tokens;\nappend, stop checks,\nstream", ("sample", "on_tokens", "on_step_end")),
    ("reap", "ended requests leave;\ntheir KV blocks freed\n(one place)", ("on_finished",)),
]

# hooks outside the step: (hook, when)
OUTSIDE: list[tuple[str, str]] = [
    ("check_request", "once per request, when it is added"),
    ("route", "once per request, in a cluster: which replica"),
    ("estimate_output_tokens", "asked by plugins from their own hooks"),
]


def check() -> list[str]:
    """What is wrong with `PHASES` and `OUTSIDE` against the hookspecs (empty when nothing)."""
    from metroline.core.plugins import hookspecs

    protocol: list[str] = []
    for names, _ in hookspecs.STEP_PROTOCOL:
        for name in names:
            if name not in protocol:
                protocol.append(name)
    drawn: list[str] = []
    for _, _, hooks in PHASES:
        for hook in hooks:
            if hook not in drawn:
                drawn.append(hook)
    problems = []
    if drawn != protocol:
        problems.append(f"the phases draw {drawn}, the step protocol calls {protocol} (first calls, in order)")
    from metroline.api import HOOK_NAMES

    every = set(HOOK_NAMES)
    outside = [hook for hook, _ in OUTSIDE]
    if sorted(every - set(protocol)) != sorted(outside):
        problems.append(f"the hooks outside the step are {sorted(every - set(protocol))}, the picture names {sorted(outside)}")
    return problems


def draw(path: Path = OUT) -> None:
    """Write the picture to `path` (SVG, its text kept as text, no date in it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from metroline.core.plugins import hookspecs

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "metroline-step", "font.family": "DejaVu Sans"})
    decisions = set(hookspecs.DECISION_HOOKS)
    width, gap = 1.8, 0.25
    fig, ax = plt.subplots(figsize=(17, 6))
    ax.set_xlim(-0.2, len(PHASES) * (width + gap))
    ax.set_ylim(-2.75, 2.6)
    ax.axis("off")
    ax.text(0, 2.45, "one Engine.step: the scheduler plans, the executor runs the plan, the engine commits the tokens",
            fontsize=12, weight="bold", va="center")
    for i, (phase, does, hooks) in enumerate(PHASES):
        x = i * (width + gap)
        executor = phase == "execute"
        ax.add_patch(FancyBboxPatch((x, 0.55), width, 1.15, boxstyle="round,pad=0.03",
                                    fc="#f2f2f2" if executor else "#dceefb", ec="#555555"))
        ax.text(x + width / 2, 1.45, phase, ha="center", va="center", fontsize=11, weight="bold")
        ax.text(x + width / 2, 0.98, does, ha="center", va="center", fontsize=8, linespacing=1.25)
        if i + 1 < len(PHASES):
            ax.add_patch(FancyArrowPatch((x + width + 0.02, 1.12), (x + width + gap - 0.02, 1.12),
                                         arrowstyle="-|>", mutation_scale=12, color="#333333"))
        for j, hook in enumerate(hooks):
            y = 0.2 - j * 0.36
            decision = hook in decisions
            ax.text(x + width / 2, y, hook, ha="center", va="center", fontsize=8.6, family="DejaVu Sans Mono",
                    color="#0b4f8a" if decision else "#6b6b6b", weight="bold" if decision else "normal",
                    bbox=dict(boxstyle="round,pad=0.25", fc="#ffffff", ec="#0b4f8a" if decision else "#bbbbbb"))
    # the loop back: the next step starts over
    first, last = width / 2, (len(PHASES) - 1) * (width + gap) + width / 2
    ax.plot([last, last, first], [1.73, 1.95, 1.95], color="#999999", linestyle="--", linewidth=1)
    ax.add_patch(FancyArrowPatch((first, 1.95), (first, 1.74), arrowstyle="-|>", mutation_scale=12,
                                 color="#999999", linestyle="--"))
    ax.text((first + last) / 2, 2.03, "the next step", ha="center", fontsize=8, color="#777777")
    ax.text(0, -1.6, "hook points:", fontsize=9, weight="bold", va="center")
    ax.text(1.3, -1.6, "decision (a plugin answers; firstresult, wrappers see the answer below)", fontsize=8.6,
            color="#0b4f8a", weight="bold", va="center")
    ax.text(9.6, -1.6, "observer (every plugin hears it)", fontsize=8.6, color="#6b6b6b", va="center")
    ax.text(0, -2.05, "outside the step:", fontsize=9, weight="bold", va="center")
    x = 1.75
    for hook, when in OUTSIDE:
        ax.text(x, -2.05, hook, fontsize=8.6, family="DejaVu Sans Mono", color="#0b4f8a", weight="bold", va="center",
                bbox=dict(boxstyle="round,pad=0.25", fc="#ffffff", ec="#0b4f8a"))
        ax.text(x, -2.45, when, fontsize=7.6, va="center")
        x += 4.8
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the phases against the hookspecs")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the SVG to write (default: {OUT.name} in docs/_static/)")
    args = parser.parse_args(argv)
    problems = check()
    for problem in problems:
        print(f"step_diagram: {problem}", file=sys.stderr)
    if problems:
        return 1
    if not args.check:
        draw(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
