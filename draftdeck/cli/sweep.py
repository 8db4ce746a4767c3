"""`draftdeck sweep`: a drafter evaluated at every point of a grid of eval options, run in this process.

    draftdeck sweep CHECKPOINT --target DIR --prompts FILE --grid block_size=4,8 --grid mode=greedy,sampled
        [eval options] --out DIR

Options are the `sweep` job kind's parameters (draftdeck/drafter/eval/sweep_params.py): the eval's own,
each point's figures its eval's. Prints one line per point, the Pareto front and the recommended flags.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from draftdeck.cli.common import out, usage_exit
from draftdeck.cli.data import REPORT
from draftdeck.cli.drafter import _run
from draftdeck.cli.options import job_command
from draftdeck.drafter.eval.sweep_params import SweepBase, SweepParams


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def sweep(params: SweepBase, *, report: Path | None) -> None:
    from draftdeck.drafter.eval.sweep import run_sweep
    from draftdeck.drafter.eval.sweep_front import Point

    if params.out is None:
        raise usage_exit("--out is required: the folder for sweep.json and each point's eval.json")
    result = _run(run_sweep, params, f"sweep {params.inputs[0]}", report)
    sw = result.extra["sweep"]
    points = [Point.from_json(p) for p in sw["points"]]
    front = set(sw["pareto"])
    head = ("", "point", "tau", "verif/st", "tok/s", "target/s", "speedup", "lossless")
    clock = "per CPU second" if sw["clock"] == "cpu" else "per wall-clock second"
    out.print("{:<2} {:<28} {:>6} {:>8} {:>6} {:>8} {:>7} {:>8}".format(*head), highlight=False)
    for p in points:
        mark = ("*" if p.point in front else " ") + ("R" if p.point == sw["recommended"] else " ")
        said = ", ".join(f"{k}={v}" for k, v in p.params.items())
        lossless = {True: "yes", False: "NO", None: "sampled"}[p.lossless]
        out.print(
            f"{mark:<2} {escape(said):<28} {_num(p.tau, '.3f'):>6} {_num(p.verified_per_step, '.2f'):>8}"
            f" {_num(p.tokens_per_s, ',.0f'):>6} {_num(p.target_tokens_per_s, ',.0f'):>8}"
            f" {_num(p.speedup, '.2f'):>7} {lossless:>8}",
            highlight=False,
        )
    out.print(f"tau incl. bonus (vLLM's counters); tok/s {clock} on {sw['device']}; * the Pareto front of"
              " tau and tok/s; R recommended:"
              f" {escape(sw['rule'])}", highlight=False, soft_wrap=True)  # fmt: skip
    for reading in sw["serving"]:
        said = f"{reading['server']}: {reading.get('flags')}"
        out.print(f"  {escape(said)}", highlight=False, soft_wrap=True)
    out.print(escape(sw["note"]), highlight=False, soft_wrap=True)
    out.print(f"wrote {escape(str(Path(params.out) / 'sweep.json'))}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("sweep")(
        job_command(SweepParams, sweep, required=("out",), extra=[REPORT],
                    doc="Evaluate a drafter at every point of a grid of eval options (--grid PARAM=V1,V2,"
                    " repeated) on the same prompts: tau against tokens/s, the Pareto front, and the vLLM"
                    " and SGLang flags of the fastest lossless point.")
    )  # fmt: skip
