"""The built wheel runs on its own: templates, static files and migrations come with it as package data,
and the dashboard starts and serves its pages without the `train` extra (torch: issue 49).

The wheel is built from a copy of just what packaging reads, installed with --no-deps into a fresh venv
outside the checkout that sees the shared venv's packages less torch's (links to them: no downloads) but
not its editable install of this checkout, and `draftdeck up` runs from an empty temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.browser.harness import free_port
from tests.conftest import REPO_ROOT
from tests.support.datasets import stop_group

pytestmark = pytest.mark.slow

# What the `train` extra adds that nothing else needs: torch's wheel installs these top-level names
# (safetensors, the extra's other half, stays: transformers requires it).
TRAIN_ONLY = ("torch", "functorch", "torchgen")
PAGES = ("/", "/jobs", "/runs", "/evals", "/datasets")
PACKAGED = ["pyproject.toml", "setup.py", "README.md", "draftdeck", "app", "workers", "templates", "static",
            "migrations"]  # fmt: skip


def run(argv: list[str], **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return str(done.stdout)


def get(
    url: str, timeout: float = 60.0, server: tuple[subprocess.Popen, Path] | None = None
) -> tuple[int, bytes]:
    """The page's status and body, waiting for the server to listen; `server` (its process and log): a
    server that exited fails at once, with its log's end (a missing module, say)."""
    deadline = time.monotonic() + timeout
    while True:
        if server is not None and server[0].poll() is not None:
            raise AssertionError(
                f"the server exited {server[0].returncode}:\n{server[1].read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:  # the server answered: no retry
            return exc.code, exc.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The venv's bin folder, with the wheel installed."""
    src = tmp_path / "src"
    src.mkdir()
    for name in PACKAGED:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / name, src / name)
    dist = tmp_path / "dist"
    # The shared venv's setuptools builds it: no build isolation, so nothing is downloaded.
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), "."], cwd=src)
    (wheel,) = dist.glob("draftdeck-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)])
    run([*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(wheel)])
    site = Path(
        run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).strip()
    )
    # The shared venv's packages less the train extra's, after the venv's own: an install without
    # extras. A plain path line runs none of the .pth files there, so its editable finder for the
    # checkout stays out.
    (site / "shared-venv.pth").write_text(str(without_train_extra(tmp_path / "shared")) + "\n")
    shutil.rmtree(src)
    return venv / "bin"


def without_train_extra(into: Path) -> Path:
    """A folder of links to each package of the shared venv but torch's."""
    into.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if entry.name.split("-")[0] not in TRAIN_ONLY:
            (into / entry.name).symlink_to(entry)
    return into


def test_the_wheel_without_the_train_extra_serves_pages_static_files_and_migrates_outside_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRAFTDECK_", "PYTHON"))}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    where = run([str(installed / "python"), "-c", "import app, draftdeck, workers; print(app.__file__)"],
                env=env, cwd=tmp_path)  # fmt: skip
    assert where.startswith(str(installed.parent)), where  # the installed package, not the checkout
    no_torch = subprocess.run([str(installed / "python"), "-c", "import torch"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "No module named 'torch'" in no_torch.stderr  # as a dashboard that only watches runs is installed
    # the evaluation suites ship as package data, checksums checked on loading
    count = (
        "from draftdeck.drafter.eval import suites; from draftdeck.quality import Report; "
        "print(sum(len(suites.load(n, Report())) for n in suites.names()))"
    )
    assert run([str(installed / "python"), "-c", count], env=env, cwd=tmp_path).strip() == "2043"
    cwd = tmp_path / "run"
    cwd.mkdir()
    port = free_port()
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen([str(installed / "draftdeck"), "up", "--port", str(port)], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    log.close()
    try:
        url = f"http://127.0.0.1:{port}"
        status, body = get(url + "/jobs", server=(proc, tmp_path / "up.log"))
        assert status == 200 and b"No jobs yet" in body and b"/static/live.js" in body
        for page in PAGES:  # every main page without torch (the leaderboard's used to import it)
            assert get(url + page)[0] == 200, page
        status, css = get(url + "/static/app.css")
        assert status == 200 and css == (REPO_ROOT / "static" / "app.css").read_bytes()
        status, docs = get(url + "/docs")
        assert status == 200 and b"swagger-ui-bundle.js" in docs
        assert get(url + "/static/vendor/swagger-ui-5.35.0/swagger-ui-bundle.js")[0] == 200
        # Migrations ran from the package: the tables exist in the new home's SQLite file.
        assert (cwd / "var" / "draftdeck.db").exists()
        assert get(url + "/api/jobs")[1] == b"[]"
    finally:
        stop_group(proc)
    assert "Traceback" not in (tmp_path / "up.log").read_text(errors="replace")
