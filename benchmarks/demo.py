"""`draftdeck demo` as a user runs it, timed: the one source of the demo's figures.

    python benchmarks/demo.py [--demos quick,eagle3,full] [--threads N] [--workdir DIR]

Each demo runs in a process of its own on a fresh home (`DRAFTDECK_HOME`), so its wall time, CPU time
and peak RSS (the rusage of that child) are its own: `--quick` the first time (the tiny world
built), `--quick` again (the world reused), `--quick --drafter eagle3` on that world, and with
`--demos full` the full demo the first time and once built. The machine's load average before each
run is printed beside it: on a shared machine the figures are the machine's as much as the demo's.

The last lines are the figures in the form `app/cli/demo_figures.py` holds them: the README, the
guide and `draftdeck demo --help` quote that module, and tests/docs checks that they agree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# --smoke: the same `draftdeck demo --quick` (its CLI, jobs and summary) with the quick size shrunk in
# its own process, so that the tests run this script end to end in about a minute; it measures nothing.
# 40 target steps: the target's answers are words, not the placeholders tokenize rejects (2 were).
SMOKE_SIZE = {"target_steps": 40, "prompts": 40, "max_new": 16, "train_steps": 2, "eval_prompts": 2}
SMOKE_ENV = "DRAFTDECK_DEMO_BENCH_SMOKE"  # set by main for its children
SMOKE_DEMO = """
import json, sys
from app.cli import demo
from app.cli.main import app
demo.QUICK.update(json.loads(sys.argv[1]))
app(["demo", *sys.argv[2:]])
"""


def _measure(home: Path, args: list[str]) -> dict:
    """One `draftdeck demo ARGS` on `home`, run by this interpreter as its only child: wall and CPU
    seconds, peak RSS (RUSAGE_CHILDREN holds that child alone), the load average before it, the torch
    threads it chose and its own JSON summary (its last line)."""
    import resource

    env = dict(os.environ, DRAFTDECK_HOME=str(home))
    env.pop("DATABASE_URL", None), env.pop("REDIS_URL", None)  # the embedded defaults, as `make up`
    load = os.getloadavg()[0]
    started = time.monotonic()
    command = [str(Path(sys.executable).parent / "draftdeck"), "demo", *args]
    if os.environ.get(SMOKE_ENV):
        command = [sys.executable, "-c", SMOKE_DEMO, json.dumps(SMOKE_SIZE), *args]
    run = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if run.returncode:
        raise SystemExit(f"draftdeck demo {' '.join(args)} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    threads = next((line for line in run.stderr.splitlines() if "torch threads" in line), "")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak": usage.ru_maxrss * 1024,
            "load": load, "summary": json.loads(run.stdout.strip().splitlines()[-1]),
            "threads": threads.split("torch threads: ", 1)[-1].split(",")[0]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", default="quick,eagle3", help="which: quick, eagle3 (after quick), full")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the demo's default)")
    parser.add_argument("--workdir", type=Path, help="homes under this folder (default: a temporary one)")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny quick demo, first run and built: the tests'"
    )
    opts = parser.parse_args()
    if opts.smoke:  # one thread: the smoke runs beside other tests
        os.environ[SMOKE_ENV] = "1"
        opts.demos, opts.threads = "quick", opts.threads or 1
    root = Path(opts.workdir or tempfile.mkdtemp(prefix="draftdeck-demo-bench-"))
    extra = ["--threads", str(opts.threads)] if opts.threads else []
    demos = opts.demos.split(",")
    plan = []
    if "quick" in demos:
        plan += [("quick, first run", "quick", ["--quick"]), ("quick, world built", "quick", ["--quick"])]
    if "eagle3" in demos:
        plan += [("quick --drafter eagle3, world built", "quick", ["--quick", "--drafter", "eagle3"])]
    if "full" in demos:
        plan += [("full, first run", "full", []), ("full, world built", "full", [])]
    print(f"{os.cpu_count()} cores; every run in a process of its own on a fresh home under {root}")
    print("| demo | load before | wall s | CPU s | CPU/wall | peak RSS | real tau | threads |")
    print("|---|---|---|---|---|---|---|---|")
    results: dict[str, dict] = {}
    for name, home_name, args in plan:
        r = _isolated(root / home_name, [*args, *extra])
        results[name] = r
        wall, cpu, mib = r["wall"], r["cpu"], r["peak"] / 2**20
        cells = [name, f"{r['load']:.1f}", f"{wall:.0f}", f"{cpu:.0f}", f"{cpu / wall:.2f}", f"{mib:.0f} MiB",
                 f"{r['summary']['eval_tau']:.3f}", r["threads"]]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    for size in ("quick", "full"):
        first, built = results.get(f"{size}, first run"), results.get(f"{size}, world built")
        if first and built:
            print(f"{size}: the first run takes {first['wall'] / built['wall']:.2f}x the time of a run on "
                  f"its built world, {first['peak'] / built['peak']:.2f}x its peak RSS")  # fmt: skip


def _isolated(home: Path, args: list[str]) -> dict:
    """`_measure` in a child interpreter of its own, so that its rusage holds this demo alone."""
    out = subprocess.run([sys.executable, __file__, "--child", str(home), *args],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_measure(Path(sys.argv[2]), sys.argv[3:])))
    else:
        main()
