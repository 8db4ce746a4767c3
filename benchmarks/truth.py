# ruff: noqa: E402 - imports follow the sys.path fix
"""Drafter truth on the tiny demo world, on this CPU: does each training-time tau tell real decoding,
when the data is the target's own greedy answers, its own sampled answers, or another model's?

    python benchmarks/truth.py [--quick] [--workdir DIR] [--losses ce,kl,ce+kl] [--cases own,own-text]
        [--position-weights dflash,dpace] [--optimizers adamw,muon]

Steps, as a user runs them: build the demo world (target A, seed 0) and a second one (target B, seed
1, as `build_tiny_demo(seed=1)`); answer A's demo prompts with `regenerate --local` three ways (A
greedy, A sampled at temperature 0.7, B greedy; A's greedy answers once more with the token ids it
generated dropped, so tokenize encodes their text again); tokenize each with A's tokenizer; train each exactly
as `draftdeck demo` trains; evaluate each checkpoint against A with real speculative decoding. One
table: the pre-flight's figures, the held-out tau judged by the data (the walk over the held-out
rows) and by the target (the walk over A's own answers to held-out prompts), real tau, each
training figure's gap to real, and the alerts raised before step 1, while training and at the eval.

With `--losses`, the loss is a dimension (issue 34): on A's greedy answers, its T 0.7 samples and B's
answers, each loss trains the same steps; the table gives each run's held-out tau both ways, real
greedy tau and real sampled tau (the target sampling at temperature 1, the drafter drafting its
argmax), and the held-out expected acceptance of slot 1 at T = 1. `--position-weights` and
`--optimizers` (issue 54) add each slot's weighting and the optimizer as dimensions of the same grid:
every loss x position weights x optimizer trains the same steps from the same seed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks._smoke import smoke_world
from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.tiny import build_tiny_demo
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import run_train
from draftdeck.jobs.context import LocalContext
from draftdeck.provenance import model_fingerprint
from draftdeck.regenerate.params import RegenerateParams
from draftdeck.regenerate.run import run_regenerate
from draftdeck.shards.manifest import read_manifest
from draftdeck.tokenize.job import TokenizeParams
from draftdeck.tokenize.job import run as run_tokenize

FULL = {"target_steps": 600, "prompts": 1000, "max_new": 128, "train_steps": 400, "eval_prompts": 100}
QUICK = {"target_steps": 200, "prompts": 300, "max_new": 64, "train_steps": 120, "eval_prompts": 30}
# The tests' check that the script runs, measuring nothing: the small world of benchmarks/_smoke.py,
# A's greedy answers kept and re-encoded from text (both ways a case's data is made), 2 steps each
SMOKE = {"prompts": 40, "max_new": 16, "train_steps": 2, "eval_prompts": 2}
SMOKE_CASES = "own,own-text"
CASES = [  # (slug, what the drafter trains on, which world answers, temperature)
    ("own", "A's own greedy answers", "A", 0.0),
    # the same answers with the token ids A generated dropped: tokenize encodes their text again
    ("own-text", "A's own greedy answers, re-encoded from text", "A", 0.0),
    ("own-t07", "A's own answers sampled at T 0.7", "A", 0.7),
    ("other", "B's greedy answers (another model)", "B", 0.0),
    # the same rows with no record of who answered them (data made by another tool)
    ("other-unrecorded", "B's greedy answers, unrecorded", "B", 0.0),
]


def _without(src: Path, out: Path, what: str) -> None:
    """`src`'s rows without regenerate's record of who answered them (`what` "record") or without the
    token ids the answering model generated ("ids")."""
    with src.open(encoding="utf-8") as f, out.open("w", encoding="utf-8") as g:
        for line in f:
            row = json.loads(line)
            if what == "record":
                row.pop("generation", None)
            for m in row["messages"] if what == "ids" else ():
                m.pop("token_ids", None)
            g.write(json.dumps(row, ensure_ascii=False) + "\n")


VARIANTS = {"-unrecorded": "record", "-text": "ids"}  # a case's slug suffix: what its rows are without


def _tau(values: list[tuple[int, float]], steps: list[tuple[int, float]]) -> float:
    acc, n = dict(values), dict(steps)
    last = max(n)
    return 1 + acc[last] / n[last]


def _ids_path(dataset: Path) -> str:
    """Rows whose answers are the target's own ids / rows encoded from text, from the manifest."""
    manifest = read_manifest(dataset)
    kept = (manifest.report or {}).get("counts", {}).get("ids_from_target", 0)
    return f"{kept:,} / {manifest.rows - kept:,}"


def _provenance(dataset: Path, target: Path) -> str:
    """Rows answered by the target / by another model / with no record, from the manifest."""
    answered = read_manifest(dataset).provenance
    assert answered is not None
    mine = answered.by_fingerprint(model_fingerprint(target))
    return f"{mine:,} / {answered.rows - mine - answered.no_record:,} / {answered.no_record:,}"


def prepare(root: Path, slug: str, answerer: Path, temperature: float, world_a: Path, size: dict) -> Path:
    """The case's answers, tokenized with A's tokenizer: the dataset folder."""
    answers, dataset = root / f"{slug}.jsonl", root / f"ds-{slug}"
    target = str(world_a / "target")
    suffix = next((s for s in VARIANTS if slug.endswith(s)), None)
    if suffix is not None:
        _without(root / f"{slug.removesuffix(suffix)}.jsonl", answers, VARIANTS[suffix])
    else:
        run_regenerate(RegenerateParams(
            inputs=[str(world_a / "prompts.jsonl")], out=str(answers), local=str(answerer), device="cpu",
            max_tokens=size["max_new"], temperature=temperature, seed=1 if temperature else None,
            concurrency=16, reasoning=False, keep_cut_off=True,
        ), LocalContext(root / "ctx" / f"regen-{slug}"))  # fmt: skip
    if not dataset.exists():
        run_tokenize(TokenizeParams(inputs=[str(answers)], tokenizer=target, out=str(dataset)),
                     LocalContext(root / "ctx" / f"tok-{slug}"))  # fmt: skip
    return dataset


def train_case(
    root: Path, slug: str, dataset: Path, world_a: Path, size: dict, loss: str | None = None, **options: str
) -> tuple:
    """Train on `dataset` exactly as `draftdeck demo` trains (with `loss`, else the default, and the
    `options` given, e.g. position_weights, optimizer): (run folder, context)."""
    loss = loss or TrainParams.model_fields["loss"].default
    name = "-".join([slug, loss.replace("*", "x"), *options.values()])
    run = root / f"run-{name}"
    # trained afresh: a run left in a kept workdir would resume at its last step and chart nothing new
    shutil.rmtree(run, ignore_errors=True)
    train_ctx = LocalContext(root / "ctx" / f"train-{name}")
    steps = size["train_steps"]
    run_train(TrainParams(
        inputs=[str(dataset)], target=str(world_a / "target"), out=str(run), block_size=8, layers=1,
        anchors_per_seq=8, batch_size=32, lr=3e-3, warmup_ratio=0.05, max_steps=steps, device="cpu", seed=0,
        heldout_fraction=0.1, checkpoint_every=max(10, steps // 4), eval_every=max(10, steps // 4),
        log_every=5, loss=loss, **options,
    ), train_ctx)  # fmt: skip
    return run, train_ctx


def eval_case(root: Path, slug: str, dataset: Path, run: Path, world_a: Path, size: dict, **mode) -> tuple:
    """Real speculative decoding of the run's best checkpoint against A: (figures, context)."""
    eval_ctx = LocalContext(root / "ctx" / f"eval-{run.name}-{mode.get('mode', 'greedy')}")
    report = run_eval(EvalParams(
        inputs=[str(dataset)], target=str(world_a / "target"), checkpoint=str(run),
        out=str(root / f"eval-{run.name}-{mode.get('mode', 'greedy')}"), max_new_tokens=size["max_new"],
        max_prompts=size["eval_prompts"], heldout_fraction=0.1, **mode,
    ), eval_ctx)  # fmt: skip
    return report.extra["eval"], eval_ctx


def run_case(
    root: Path, slug: str, name: str, answerer: Path, temperature: float, world_a: Path, size: dict
) -> dict:
    dataset = prepare(root, slug, answerer, temperature, world_a, size)
    run, train_ctx = train_case(root, slug, dataset, world_a, size)
    ev, eval_ctx = eval_case(root, slug, dataset, run, world_a, size)
    truth = json.loads((run / "run.json").read_text())["truth"]
    pre = truth["preflight"]
    return {
        "case": name,
        "agreement": pre["matches"] / pre["tokens"],
        "expected": pre["expected_sum"] / pre["tokens"],
        "ratio": (pre["tokens"] - pre["matches"]) / (pre["tokens"] - pre["expected_sum"]),
        "provenance": _provenance(dataset, world_a / "target"),
        "ids": _ids_path(dataset),
        # the run's held-out figures for the evaluated checkpoint, on the rows the eval compares
        "data": ev["training"]["data_judged_tau_incl_bonus"],
        "target": ev["training"]["target_judged_tau_incl_bonus"],
        "live_data": _tau(
            train_ctx.series("heldout/walked/accepted"), train_ctx.series("heldout/walked/steps")
        ),
        "real_all": ev["methods"]["drafter"]["tau_incl_bonus_pooled"],
        # over the held-out prompts the run's target answered (the eval compares on these)
        "real": ev["training"]["real_tau_incl_bonus"],
        "real_over": ev["training"]["real_over"],
        "before": "yes" if truth["alert"] else "no",
        # raised once a run: after the pre-flight's, the held-out passes stay quiet
        "training": "(once)" if truth["alert"] else ("yes" if train_ctx.alerts else "no"),
        "eval": ",".join(k for k, _ in eval_ctx.alerts) or "none",
    }


LOSS_CASES = ["own", "own-text", "own-t07", "other"]


def loss_row(
    root: Path, slug: str, name: str, dataset: Path, world_a: Path, size: dict, loss: str, **options: str
) -> dict:
    started = time.monotonic()
    run, train_ctx = train_case(root, slug, dataset, world_a, size, loss, **options)
    train_s = time.monotonic() - started
    greedy, _ = eval_case(root, slug, dataset, run, world_a, size)
    sampled, _ = eval_case(root, slug, dataset, run, world_a, size, mode="sampled", temperature=1.0, seed=0)
    last = dict(train_ctx.series("heldout/pos/1/accept_total"))
    step = max(last)
    return {
        "case": name,
        "loss": loss,
        "weights": options.get("position_weights", "dflash"),
        "optimizer": options.get("optimizer", "adamw"),
        "train_s": train_s,
        "data": greedy["training"]["data_judged_tau_incl_bonus"],
        "target": greedy["training"]["target_judged_tau_incl_bonus"],
        "real": greedy["methods"]["drafter"]["tau_incl_bonus_pooled"],
        "sampled": sampled["methods"]["drafter"]["tau_incl_bonus_pooled"],
        "draft_prob": dict(train_ctx.series("heldout/pos/1/draft_prob_sum"))[step] / last[step],
        "expected": dict(train_ctx.series("heldout/pos/1/accept_sum"))[step] / last[step],
    }


def loss_table(
    root: Path, worlds: dict, size: dict, losses: list[str], cases: list[str], grid: list[dict[str, str]]
) -> None:
    started = time.monotonic()
    print(
        f"\nThe loss as a dimension, tiny demo world, {size['train_steps']} steps each,"
        f" {size['eval_prompts']} eval prompts, block 8, every tau incl. bonus\n"
    )
    head = ("data the drafter trained on", "loss", "position weights", "optimizer", "train s", "data-judged",
            "target-judged", "real greedy", "real sampled T=1", "slot 1: p(draft) T=1", "slot 1: Σmin(p,q)",
            "greedy vs first row", "sampled vs first row")  # fmt: skip
    print("| " + " | ".join(head) + " |", flush=True)
    print("|" + "|".join("---" for _ in head) + "|", flush=True)
    base: dict | None = None
    # each loss's position weights and optimizers together, and each row printed as soon as it is
    # measured: a grid of dozens of runs takes hours on a small machine, and a cut-off one still says
    # the most about the losses it reached
    for slug, name, w, t in (c for c in CASES if c[0] in cases):
        dataset = prepare(root, slug, worlds[w].target_dir, t, root / "A", size)
        for loss in losses:
            for options in grid:
                r = loss_row(root, slug, name, dataset, root / "A", size, loss, **options)
                base = base or r
                print(f"| {r['case']} | {r['loss']} | {r['weights']} | {r['optimizer']} | {r['train_s']:.0f}"
                      f" | {r['data']:.3f} | {r['target']:.3f} | {r['real']:.3f} | {r['sampled']:.3f}"
                      f" | {r['draft_prob']:.3f} | {r['expected']:.3f} | {r['real'] / base['real']:.3f}x"
                      f" | {r['sampled'] / base['sampled']:.3f}x |", flush=True)  # fmt: skip
    print(f"\n({time.monotonic() - started:.0f} s)")
    print(
        "\nreal greedy / real sampled: the eval's tau over every eval prompt (pooled), the target greedy or"
        " sampling at T = 1 with the drafter drafting its argmax. slot 1: the held-out expected acceptance"
        " of the first drafted token at the last held-out pass (p(draft): a greedy drafter's, what sampled"
        " decoding accepts; Σmin(p,q): a sampling drafter's)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller world and run (~4 minutes)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the worlds and runs here")
    ap.add_argument("--losses", default="", help="e.g. ce,kl,ce+kl: the loss as a dimension (issue 34)")
    ap.add_argument("--cases", default="", help="the cases to run, e.g. own,own-text (default: all)")
    ap.add_argument("--position-weights", default="", help="with --losses: e.g. dflash,dpace (issue 54)")
    ap.add_argument("--optimizers", default="", help="with --losses: e.g. adamw,muon (issue 54)")
    # 2 on a free machine; 1 when it is shared: on 2 busy cores one thread ran the demo's training 2x faster
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:  # one thread: the smoke runs beside other tests
        args.cases, args.threads = args.cases or SMOKE_CASES, 1
    cases = args.cases.split(",") if args.cases else None
    unknown = set(cases or ()) - {c[0] for c in CASES}
    if unknown:
        ap.error(f"unknown case {', '.join(sorted(unknown))}; cases: {', '.join(c[0] for c in CASES)}")
    size = SMOKE if args.smoke else QUICK if args.quick else FULL
    torch.set_num_threads(args.threads)
    # world B (another model) only where a case reads its answers
    used = [c for c in CASES if c[0] in (cases or (LOSS_CASES if args.losses else [c[0] for c in CASES]))]
    needed = {"A"} | {w for _, _, w, _ in used}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        worlds = {
            w: smoke_world(root / w, n_prompts=size["prompts"], seed=seed)
            if args.smoke
            else build_tiny_demo(
                root / w, target_steps=size["target_steps"], n_prompts=size["prompts"], seed=seed
            )
            for w, seed in (("A", 0), ("B", 1))
            if w in needed
        }
        if args.losses:
            weights = args.position_weights.split(",") if args.position_weights else [None]
            optimizers = args.optimizers.split(",") if args.optimizers else [None]
            grid = [
                {k: v for k, v in (("position_weights", w), ("optimizer", o)) if v}
                for w in weights
                for o in optimizers
            ]
            loss_table(root, worlds, size, args.losses.split(","), cases or LOSS_CASES, grid)
            return
        rows = [
            run_case(root, slug, name, worlds[w].target_dir, t, root / "A", size)
            for slug, name, w, t in CASES
            if cases is None or slug in cases
        ]
    print(f"\nDrafter truth, tiny demo world, {size['train_steps']} steps, {size['eval_prompts']} eval"
          f" prompts, block 8, every tau incl. bonus ({time.monotonic() - started:.0f} s)\n")  # fmt: skip
    head = ("data the drafter trained on", "rows by A / other / none", "rows: A's ids / text", "agree", "T=1",
            "ratio", "live chart",
            "data-judged", "target-judged", "real", "real, all", "data/real", "target/real", "alert: pre",
            "train", "eval")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print(
            f"| {r['case']} | {r['provenance']} | {r['ids']} | {r['agreement']:.1%} | {r['expected']:.1%}"
            f" | {r['ratio']:.2f} | {r['live_data']:.3f} | {r['data']:.3f} | {r['target']:.3f}"
            f" | {r['real']:.3f}"
            f" | {r['real_all']:.3f}"
            f" | {r['data'] / r['real'] - 1:+.1%}"
            f" | {r['target'] / r['real'] - 1:+.1%} | {r['before']} | {r['training']} | {r['eval']} |"
        )
    print(
        "\nrows by: who answered the rows, as the manifest records it. A's ids / text: rows trained on the"
        " token ids A generated / on answers encoded from text (the manifest's counts). agree: the target's"
        " greedy token is the data's (pre-flight, training rows); T=1: what its own"
        " temperature-1 samples would give; ratio: data disagreements / theirs (off_target_ratio 1.25)."
        " live chart: the last held-out tau judged by the data, over every held-out row (what peers show)."
        " data-judged / target-judged: the evaluated checkpoint's held-out tau walked over the held-out rows"
        " whose prompts A answered / over A's answers to them. real: the eval's, on "
        + rows[0]["real_over"]
        + "; real, all: on every eval prompt."
    )


if __name__ == "__main__":
    main()
