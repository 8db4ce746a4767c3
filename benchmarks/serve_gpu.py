# ruff: noqa: E402 - imports follow the sys.path fix
"""A served drafter on a lent GPU: vLLM serving an exported checkpoint with its target, scraped, and a
served eval on the demo's prompts: the three numbers of one drafter on one prompt set.

    draftdeck demo --quick --workdir W          # the tiny world, a trained run and its eval (CPU)
    python benchmarks/serve_gpu.py W [--port 8100] [--prompts 32]

Exports the run's best checkpoint (`export-drafter --target`, which prints the launch flags), starts
`vllm serve TARGET --speculative-config {"method": "dflash", ..., "num_speculative_tokens": B - 1}`,
waits for it, runs `eval --served-url` on the dataset's held-out prompts (offline real tau, walked tau
and served tau on the same prompts), scrapes one window with `serving watch --once --json`, and prints
one table. Needs vLLM installed on that machine; without it, it says so and exits 2.

Then (`--sweep-trees`, default 0,16,32; empty to skip) DraftDeck's own decoder on the GPU: `draftdeck
sweep` of the run over chains and trees (`--grid tree_budget=...`) on the same prompts, in wall-clock
seconds on the device: where a CPU pays per verified node, a GPU verifies a tree for about the price of
one token, so this is the table that says whether trees pay on the hardware served (τ incl. bonus,
verified tokens per step, tokens/s, speed-up, lossless), and which point `sweep.json` recommends.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import importlib.util
import json
import subprocess
import time

import httpx


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "draftdeck.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"draftdeck {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path, nargs="?", help="a `draftdeck demo` folder (dataset/, run/)")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--sweep-trees", default="0,16,32", help="tree budgets swept on the GPU ('' skips)")
    # vLLM and a GPU are the whole of this check: the smoke is what runs before them (the arguments,
    # vLLM's presence), so that the tests see it refuse cleanly where vLLM is absent
    parser.add_argument("--smoke", action="store_true", help="only the checks before vLLM starts")
    args = parser.parse_args()
    if args.workdir is None and not args.smoke:
        parser.error("the workdir of a `draftdeck demo` is needed")
    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed here: this check runs where it is (pip install vllm)", file=sys.stderr)
        sys.exit(2)
    if args.smoke:
        print("vLLM is installed; give a demo's workdir (without --smoke) to serve its drafter")
        return
    w = args.workdir.resolve()
    # the run records its target: the demo's world is under the home's demo-worlds/, not in its workdir
    target, drafter = Path(json.loads((w / "run" / "run.json").read_text())["target"]), w / "drafter"
    print(_cli("export-drafter", str(w / "run"), "--out", str(drafter), "--target", str(target)))
    block = json.loads((drafter / "config.json").read_text())["dflash_config"]["block_size"]
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": block - 1}
    base = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(["vllm", "serve", str(target), "--port", str(args.port), "--served-model-name",
                               "target", "--speculative-config", json.dumps(spec)])  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit("vLLM did not start (see its output above)")
            time.sleep(2)
        _cli("eval", str(w / "dataset"), "--target", str(target), "--checkpoint", str(w / "run"),
             "--out", str(w / "eval-served"), "--max-prompts", str(args.prompts), "--heldout-fraction", "0.1",
             "--max-new-tokens", str(args.max_new_tokens), "--device", "cuda", "--served-url", base,
             "--served-model", "target")  # fmt: skip
        served = json.loads((w / "eval-served" / "eval.json").read_text())["eval"]["served"]
        window = _cli("serving", "watch", f"{base}/metrics", "--interval", "1", "--once", "--json")
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"{'figure':<44} {'tau incl. bonus':>16}")
    for name, value in (("walked (the checkpoint, these prompts)", served["walked_tau_incl_bonus"]),
                        ("real, offline (DraftDeck's decoder)", served["offline_real_tau_incl_bonus"]),
                        ("served by vLLM (counters over the eval)", served["tau_incl_bonus"])):  # fmt: skip
        print(f"{name:<44} {value:>16.3f}")
    ratio = served["tau_incl_bonus"] / served["offline_real_tau_incl_bonus"]
    print(f"served / offline: {ratio:.3f}x; other traffic: {served.get('other_traffic')}")
    print(f"a scraped window after it: {window.strip() or 'idle'}")
    if args.sweep_trees:
        _sweep_trees(w, target, args)


def _sweep_trees(w: Path, target: Path, args: argparse.Namespace) -> None:
    """Chains and trees of the run on the GPU (`draftdeck sweep`), one row per point."""
    out = w / "sweep-gpu"
    _cli("sweep", str(w / "run"), "--target", str(target), "--prompts", str(w / "dataset"),
         "--grid", f"tree_budget={args.sweep_trees}", "--max-prompts", str(args.prompts),
         "--max-new-tokens", str(args.max_new_tokens), "--heldout-fraction", "0.1", "--device", "cuda",
         "--out", str(out))  # fmt: skip
    sweep = json.loads((out / "sweep.json").read_text())
    print(
        f"\n{'tree budget':>11} {'tau incl. bonus':>16} {'verified/step':>14} {'tok/s':>8}"
        f" {'speed-up':>9} lossless"
    )
    for p in sweep["points"]:
        tau = (p["accepted"] + p["verify_steps"]) / p["verify_steps"]
        verified = "-" if p["verified"] is None else f"{p['verified'] / p['verify_steps']:.1f}"
        speed, target_speed = p["tokens"] / p["seconds"], p["target_tokens"] / p["target_seconds"]
        print(f"{p['params']['tree_budget']:>11} {tau:>16.3f} {verified:>14} {speed:>8.1f}"
              f" {speed / target_speed:>8.2f}x {p['lossless']}")  # fmt: skip
    print(f"recommended (fastest lossless): point {sweep['recommended']}; flags in {out / 'sweep.json'}")


if __name__ == "__main__":
    main()
