"""The arrows run one way: workers/ -> app/ -> draftdeck/, checked on what each layer really imports;
and inside the core and the service, no package imports a package that imports it back."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

KINDS = "draftdeck.drafter.kinds"  # the drafter kinds' registry; each kind a package under it


def _loaded_after(imports: str) -> set[str]:
    code = f"import sys\n{imports}\nprint('\\n'.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_the_core_and_its_cli_import_nothing_of_the_web_the_queue_or_sql() -> None:
    loaded = _loaded_after("import draftdeck.cli, draftdeck.cli.data, draftdeck.cli.tokens, draftdeck.kinds")
    assert not loaded & {"app", "workers", "fastapi", "celery", "kombu", "sqlmodel", "sqlalchemy", "uvicorn"}


def test_the_web_app_never_imports_workers() -> None:
    loaded = _loaded_after("import app.web.main, app.cli.main, app.run.job, app.run.chunks, app.run.submit")
    assert "workers" not in loaded


def test_writing_shards_does_not_import_datasets(tmp_path: Path) -> None:
    """A short `draftdeck tokenize` would spend ~0.5 s importing datasets for its schema alone."""
    code = (
        "import numpy as np\n"
        "from pathlib import Path\n"
        "from draftdeck.shards.store import ShardRow, ShardWriter, write_metadata\n"
        f"out = Path({str(tmp_path / 'ds')!r})\n"
        "w = ShardWriter(out, 10)\n"
        "w.add(ShardRow(np.arange(4, dtype=np.int32), np.array([0, 0, 1, 1], np.uint8), 'f', 1, -1, False))\n"
        "assert [s.rows for s in w.close()] == [1]\n"
    )
    loaded = _loaded_after(code)
    assert "pyarrow" in loaded  # the shard was written
    assert "datasets" not in loaded


def _imports_between(inside: str) -> dict[str, dict[str, str]]:
    """The packages (and top modules) directly inside `inside`, each with the ones it imports and one
    file that does it. Imports inside functions count: a lazy import is still a dependency."""
    depth = inside.count(".") + 2

    def unit(module: str) -> str | None:
        parts = module.split(".")
        if inside.startswith("draftdeck.drafter") and module.startswith(KINDS + "."):
            # each kind's package is a unit, apart from the registry, whose part its options are (the
            # train job's parameters are made of them; they import nothing but the registry's base)
            if len(parts) > KINDS.count(".") + 2 and parts[KINDS.count(".") + 2] == "options":
                return KINDS
            return ".".join(parts[: KINDS.count(".") + 2])
        return ".".join(parts[:depth]) if len(parts) >= depth and module.startswith(inside + ".") else None

    edges: dict[str, dict[str, str]] = {}
    for path in sorted(REPO_ROOT.joinpath(*inside.split(".")).rglob("*.py")):
        src = unit(".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__"))
        if src is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for dst in {unit(name) for name in names} - {None, src}:
                edges.setdefault(src, {}).setdefault(str(dst), str(path.relative_to(REPO_ROOT)))
    return edges


def _cycles(edges: dict[str, dict[str, str]]) -> list[str]:
    """Every import from one package to another that reaches the first one back, with its file."""

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in edges.get(todo.pop(), {}):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return [
        f"{src} -> {dst} ({where}), and {dst} reaches {src} back"
        for src, dsts in sorted(edges.items())
        for dst, where in sorted(dsts.items())
        if src in reach(dst)
    ]


@pytest.mark.parametrize("inside", ["draftdeck", "draftdeck.drafter", "app"])
def test_no_package_imports_a_package_that_imports_it_back(inside: str) -> None:
    edges = _imports_between(inside)
    assert len(edges) >= 3, edges  # the packages really were read
    assert _cycles(edges) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    assert _cycles({"a": {"b": "a.py"}, "b": {"c": "b.py"}, "c": {"a": "c.py"}}) == [
        "a -> b (a.py), and b reaches a back",
        "b -> c (b.py), and c reaches b back",
        "c -> a (c.py), and a reaches c back",
    ]
    assert _cycles({"a": {"b": "a.py"}, "b": {"c": "b.py"}}) == []


def kind_imports(source: str) -> list[int]:
    """The lines of `source` that import a drafter kind's package (not the registry itself)."""
    packages = {
        p.name for p in (REPO_ROOT / KINDS.replace(".", "/")).iterdir() if (p / "__init__.py").is_file()
    }
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(n.startswith(KINDS + ".") and n.split(".")[3] in packages for n in names):
            lines.append(node.lineno)
    return lines


def test_no_stage_imports_a_drafter_kind_s_package() -> None:
    """The stages (train, eval, export, plan, the CLI, app/) know the drafter kinds through their
    registry (draftdeck.drafter.kinds) by name; only the kinds' own packages import one another."""
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for tree in ("draftdeck", "app", "workers")
        for path in sorted((REPO_ROOT / tree).rglob("*.py"))
        if not path.is_relative_to(REPO_ROOT / KINDS.replace(".", "/"))
        for line in kind_imports(path.read_text())
    ]
    assert found == []
    assert kind_imports("from draftdeck.drafter.kinds import get_kind") == []  # the registry: allowed
    assert kind_imports("from draftdeck.drafter.kinds.dflash.model import DFlashDrafter") == [1]
    assert kind_imports("import draftdeck.drafter.kinds.eagle3") == [1]
    assert kind_imports("from draftdeck.drafter.kinds import dflash") == [1]


def test_only_the_cli_and_app_import_the_table_of_kinds() -> None:
    """draftdeck/kinds.py imports every kind: a core module importing it would close a loop."""
    importers = [
        str(p.relative_to(REPO_ROOT))
        for p in sorted((REPO_ROOT / "draftdeck").rglob("*.py"))
        if "draftdeck.kinds" in p.read_text() and p.name != "kinds.py" and "cli" not in p.parts
    ]
    assert importers == []


@pytest.mark.parametrize(("tests", "code"), [("tests/unit", "draftdeck"), ("tests/app", "app")])
def test_test_folders_mirror_the_code(tests: str, code: str) -> None:
    """tests/unit/<package>/ tests draftdeck/<package>/, tests/app/<package>/ tests app/<package>/: a
    newcomer finds a module's tests by its path."""
    folders = [p for p in (REPO_ROOT / tests).rglob("*") if p.is_dir() and p.name != "__pycache__"]
    assert folders, tests
    orphans = [
        str(p.relative_to(REPO_ROOT))
        for p in folders
        if not (REPO_ROOT / code / p.relative_to(REPO_ROOT / tests)).is_dir()
    ]
    assert orphans == []
