"""The tests against dflash and speculators build a venv of their own with pip. A build that fails
fails them: it skipped them before, and a skip reads as a pass where CI cannot install a peer's pin.
They are skipped only on the user's word (DRAFTDECK_SKIP_INTEROP=1), which CI cannot give."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.eval import SKIP_INTEROP, interop_opt_out, package_venv


def test_interop_runs_unless_the_user_opts_out() -> None:
    assert interop_opt_out({}) is None
    assert interop_opt_out({"CI": "1"}) is None
    assert interop_opt_out({SKIP_INTEROP: "0"}) is None
    reason = interop_opt_out({SKIP_INTEROP: "1"})
    assert reason is not None and SKIP_INTEROP in reason and "by request" in reason


def test_ci_cannot_opt_out() -> None:
    with pytest.raises(pytest.fail.Exception, match="under CI"):
        interop_opt_out({SKIP_INTEROP: "1", "CI": "true"})


@pytest.mark.parametrize("ci", ["", "1"])
def test_a_venv_pip_cannot_build_fails_the_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    # a real venv and a real pip, given a package that is not there: pip fails within seconds,
    # offline too (no torch first: that is the long install the real venvs start with)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    monkeypatch.delenv(SKIP_INTEROP, raising=False)
    missing = tmp_path / "no-such-package"
    # a skip is caught too, to fail here: uncaught it would end this test as skipped, not failed
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception)) as got:
        package_venv("nothing", "0", str(missing), first=())
    assert got.type is pytest.fail.Exception, f"a failed venv build skipped: {got.value}"
    assert "pip cannot install" in str(got.value) and SKIP_INTEROP in str(got.value)
    assert not list((tmp_path / ".cache" / "draftdeck-tests").iterdir())  # no half-built venv left
