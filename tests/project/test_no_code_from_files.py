"""Nothing the project reads can run code (issue 48): no `torch.load` without `weights_only=True`, no
`pickle.load`/`loads` (nor `dill`, `joblib`, `shelve`, `marshal`) of anything, no `np.load(...,
allow_pickle=True)`, and no `trust_remote_code=True`, anywhere in the project's Python: a run folder, a
dataset folder or a downloaded model may have been made to run code when read."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

TREES = ("draftdeck", "app", "workers", "benchmarks", "tests", "scripts", "migrations")
UNPICKLERS = {"pickle", "dill", "joblib", "shelve", "marshal", "cloudpickle"}


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_loads(source: str, where: str) -> list[str]:
    """`where:line what` for each call in `source` that could run code a file holds."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module in UNPICKLERS
            and any(a.name.startswith("load") or a.name == "Unpickler" for a in node.names)
        ):
            found.append(f"{where}:{node.lineno} imports a loader from {node.module}")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func, owner = node.func.attr, node.func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if owner_name == "torch" and func == "load" and not _is_true(_keyword(node, "weights_only")):
            found.append(f"{where}:{node.lineno} torch.load without weights_only=True")
        if owner_name in UNPICKLERS and (func.startswith("load") or func in ("Unpickler", "open")):
            found.append(f"{where}:{node.lineno} {owner_name}.{func}")
        if owner_name == "np" and func == "load" and _is_true(_keyword(node, "allow_pickle")):
            found.append(f"{where}:{node.lineno} np.load with allow_pickle=True")
        if _is_true(_keyword(node, "trust_remote_code")):
            found.append(f"{where}:{node.lineno} trust_remote_code=True")
    return found


def test_no_call_in_the_project_can_run_code_a_file_holds() -> None:
    found = []
    for tree in TREES:
        for path in sorted((REPO_ROOT / tree).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT)
            if rel == Path(__file__).relative_to(REPO_ROOT):
                continue  # this file spells the calls out to find them
            found += unsafe_loads(path.read_text(encoding="utf-8"), str(rel))
    assert not found, "\n".join(found)


def test_the_check_finds_each_unsafe_call() -> None:
    planted = "\n".join(
        [
            "import pickle, torch, numpy as np",
            "from pickle import loads",
            "torch.load(p)",
            "torch.load(p, weights_only=False)",
            "pickle.load(f)",
            "pickle.loads(b)",
            "np.load(p, allow_pickle=True)",
            "AutoModel.from_pretrained(p, trust_remote_code=True)",
            "torch.load(p, weights_only=True)",  # the safe ones: not found
            "np.load(p)",
        ]
    )
    assert [line.split(" ", 1)[0] for line in unsafe_loads(planted, "x.py")] == [
        f"x.py:{n}" for n in range(2, 9)
    ]
