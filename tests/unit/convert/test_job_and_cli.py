"""`draftdeck convert` exit codes and files, and the `convert` job kind run through app.run.job."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from draftdeck.cli import app
from tests.conftest import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "formats"
QUALITY = TEST_FIXTURES / "quality"


@pytest.fixture
def data(dd_home: Path) -> Path:
    """The fixtures copied inside the data roots (dd_home/data)."""
    target = dd_home / "data"
    for f in FIXTURES.iterdir():
        shutil.copy(f, target / f.name)
    return target


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["convert", *args])
    return result.exit_code, result.output


class TestCli:
    def test_to_has_one_default_everywhere(self, data: Path) -> None:
        """The in-process command, the API and the form share the kind's default output format."""
        from draftdeck.convert.job import ConvertParams

        default = ConvertParams.model_fields["to"].default
        out = data / "o.jsonl"
        code, text = _run(str(data / "openai_mixed.jsonl"), "--out", str(out))
        assert code == 0, text
        first = json.loads(out.read_text().splitlines()[0])
        assert default == "sharegpt" and "conversations" in first and f"convert -> {default}" in text

    def test_success_writes_output_and_report(self, data: Path) -> None:
        out, rep = data / "o.jsonl", data / "r.json"
        code, text = _run(
            str(data / "sharegpt.json"),
            str(data / "alpaca.json"),
            "--to",
            "openai",
            "--out",
            str(out),
            "--report",
            str(rep),
        )
        assert code == 0, text
        assert len(out.read_bytes().splitlines()) == 12  # sharegpt.json's empty gpt turn is rejected
        report = json.loads(rep.read_text())
        assert {"rows_in", "rows_out", "rejected", "warnings", "formats", "outputs", "examples"} <= set(
            report
        )
        assert report["formats"] == {"alpaca": 4, "hermes": 1, "openai": 1, "sharegpt": 7}
        [output] = report["outputs"]
        assert (output["path"], output["rows"]) == (str(out), 12)
        assert len(output["sha256"]) == 64
        assert "formats: sharegpt 7, alpaca 4, hermes 1, openai 1" in text

    def test_unknown_keys_fail_with_exit_1_naming_keys(self, data: Path) -> None:
        out, rep = data / "o.jsonl", data / "r.json"
        code, text = _run(
            str(data / "unknown_keys.jsonl"), "--to", "sharegpt", "--out", str(out), "--report", str(rep)
        )
        assert code == 1
        assert "empty output" in text
        assert "bar, baz, foo" in " ".join(text.split())
        assert not out.exists()
        assert json.loads(rep.read_text())["rejected"] == {"unknown_format": 2}

    def test_strict_and_max_rejected(self, data: Path) -> None:
        args = [str(data / "openai_mixed.jsonl"), "--to", "sharegpt", "--out", str(data / "o.jsonl")]
        assert _run(*args)[0] == 0
        code, text = _run(*args, "--strict")
        assert code == 1
        assert "--strict" in " ".join(text.split())
        bad = [str(data / "bad_bytes.jsonl"), "--to", "sharegpt", "--out", str(data / "o.jsonl")]
        assert _run(*bad)[0] == 1  # 4 of 5 rows rejected: past the default half
        assert _run(*bad, "--max-rejected", "0.9")[0] == 0

    def test_policy_file(self, data: Path) -> None:
        pol = data / "policy.json"
        pol.write_text(json.dumps({"codes": {"invalid_tool_arguments": "reject"}}))
        rep = data / "r.json"
        code, _ = _run(
            str(data / "openai_mixed.jsonl"),
            "--to",
            "openai",
            "--out",
            str(data / "o.jsonl"),
            "--policy-file",
            str(pol),
            "--report",
            str(rep),
        )
        assert code == 0
        assert json.loads(rep.read_text())["rejected"] == {"invalid_tool_arguments": 1}
        pol.write_text("{not json")
        assert (
            _run(
                str(data / "openai_mixed.jsonl"),
                "--to",
                "openai",
                "--out",
                str(data / "o.jsonl"),
                "--policy-file",
                str(pol),
            )[0]
            == 2
        )

    def test_tree_paths_and_prompt_only(self, data: Path) -> None:
        out = data / "o.jsonl"
        assert _run(str(data / "tree.jsonl"), "--to", "openai", "--out", str(out))[0] == 0
        assert len(out.read_bytes().splitlines()) == 2
        assert (
            _run(str(data / "tree.jsonl"), "--to", "openai", "--out", str(out), "--tree-paths", "best")[0]
            == 0
        )
        [row] = [orjson.loads(x) for x in out.read_bytes().splitlines()]
        assert row["messages"][-1]["content"] == "Red, the color of fire."
        assert _run(str(data / "prompts.jsonl"), "--to", "openai", "--out", str(out))[0] == 1
        assert (
            _run(str(data / "prompts.jsonl"), "--to", "openai", "--out", str(out), "--allow-prompt-only")[0]
            == 0
        )
        assert len(out.read_bytes().splitlines()) == 4

    def test_placeholders_strip_gives_prompts_to_regenerate(self, tmp_path: Path) -> None:
        src, out, rep = QUALITY / "padded_ok.jsonl", tmp_path / "o.jsonl", tmp_path / "r.json"
        code, text = _run(str(src), "--to", "sharegpt", "--out", str(out), "--allow-prompt-only")
        assert code == 1 and "empty output" in text  # allowing prompt-only rows does not strip "OK."
        code, text = _run(str(src), "--to", "sharegpt", "--out", str(out), "--placeholders", "strip",
                          "--report", str(rep))  # fmt: skip
        assert code == 0, text
        rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
        assert len(rows) == 200 and all([t["from"] for t in r["conversations"]] == ["human"] for r in rows)
        assert json.loads(rep.read_text())["warnings"] == {"placeholder_stripped": 200}

    def test_placeholder_thresholds_are_options(self, tmp_path: Path) -> None:
        src, out, rep = QUALITY / "short_real_answers.jsonl", tmp_path / "o.jsonl", tmp_path / "r.json"
        code, text = _run(str(src), "--to", "openai", "--out", str(out), "--report", str(rep))
        assert code == 0, text
        report = json.loads(rep.read_text())
        assert report["rows_out"] == 1100 and report["rejected"] == {}  # "Yes." and a repeated answer kept
        assert report["warnings"] == {"duplicate_conversation": 59}
        code, text = _run(str(src), "--to", "openai", "--out", str(out), "--report", str(rep),
                          "--placeholder-min-share", "0.01")  # fmt: skip
        assert code == 0, text
        assert json.loads(rep.read_text())["rejected"] == {"placeholder_response": 40}

    def test_heavy_losses_fail_or_alert(self, tmp_path: Path) -> None:
        src, out = QUALITY / "mostly_rejected.jsonl", tmp_path / "o.jsonl"
        code, text = _run(str(src), "--to", "openai", "--out", str(out))
        assert code == 1 and "5 of 6 rows rejected" in " ".join(text.split())
        code, text = _run(str(src), "--to", "openai", "--out", str(out), "--max-rejected", "1")
        assert code == 0, text
        assert "alert high_rejected" in text and "5 of 6 rows rejected (83.3%)" in " ".join(text.split())

    def test_the_report_counts_merged_lines_apart_from_rejected_ones(self, tmp_path: Path) -> None:
        """Issue 49: the JSON report counted an agent session's merged lines under `rejected`, while the
        job page and this command's table show them as merged: the report gives them apart too."""
        out, rep = tmp_path / "o.jsonl", tmp_path / "r.json"
        session = TEST_FIXTURES / "agents" / "session.jsonl"
        code, text = _run(str(session), "--out", str(out), "--report", str(rep))
        assert code == 0, text
        report = json.loads(rep.read_text())
        assert report["rejected"] == {"abandoned_branch": 1}  # the one line left out: a retried answer
        assert report["merged"] == {"merged_event": 12, "session_metadata": 3}
        assert (report["rows_in"], report["rows_out"]) == (18, 2)
        assert report["rows_in"] == report["rows_out"] + sum(report["rejected"].values()) + sum(
            report["merged"].values()
        )
        assert "sum(merged)" in report["accounting"]
        assert "merged: merged_event" in text and "rejected: abandoned_branch" in text

    def test_any_readable_path_is_accepted_in_process(self, data: Path, tmp_path: Path) -> None:
        """The data-root sandbox is the server's: a local user converts their own files anywhere."""
        outside = tmp_path / "outside.jsonl"
        shutil.copy(data / "query_response.jsonl", outside)
        code, text = _run(str(outside), "--to", "openai", "--out", str(tmp_path / "elsewhere.jsonl"))
        assert code == 0, text
        assert (tmp_path / "elsewhere.jsonl").stat().st_size > 0

    @pytest.mark.parametrize("target", ["input", "folder"])
    def test_an_output_that_would_replace_an_input_or_a_folder_is_refused(
        self, data: Path, target: str
    ) -> None:
        src = data / "openai_mixed.jsonl"
        before = src.read_bytes()
        out = src if target == "input" else data
        code, text = _run(str(src), "--to", "sharegpt", "--out", str(out))
        assert code == 2, text
        assert ("is the input" if target == "input" else "existing folder") in " ".join(text.split())
        assert src.read_bytes() == before  # its rejected rows are still on disk

    def test_usage_errors_exit_2(self, data: Path, tmp_path: Path) -> None:
        assert _run(str(data / "missing.jsonl"), "--to", "openai", "--out", str(data / "o.jsonl"))[0] == 2
        assert _run(str(data / "alpaca.json"), "--to", "csv", "--out", str(data / "o.jsonl"))[0] == 2
        assert _run(str(data / "alpaca.json"), "--to", "openai")[0] == 2  # --out is required
        assert (
            _run(
                str(data / "alpaca.json"), "--to", "openai", "--out", str(data / "o"), "--tree-paths", "some"
            )[0]
            == 2
        )


class TestJobKind:
    def _job(self, params: dict) -> int:
        from app.run import submit
        from app.settings import get_settings
        from app.store import records as jobs
        from app.store.db import session_scope

        with session_scope() as session:
            kind, confined, queue = submit.validate("convert", params, get_settings())
            return jobs.create_job(session, kind, confined, queue).id or 0

    def _get(self, job_id: int):
        from sqlmodel import select

        from app.store import records as jobs
        from app.store.db import session_scope
        from app.store.models import JobEvent, JobOutput

        with session_scope() as session:
            job = jobs.get_job(session, job_id)
            events = list(session.exec(select(JobEvent).where(JobEvent.job_id == job_id)))
            outputs = list(session.exec(select(JobOutput).where(JobOutput.job_id == job_id)))
        return job, events, outputs

    def test_convert_job_succeeds_into_job_folder(self, migrated: Path) -> None:
        from app.run.job import run_job

        data = migrated / "data"
        shutil.copy(FIXTURES / "openai_mixed.jsonl", data / "a.jsonl")
        shutil.copy(FIXTURES / "tree.jsonl", data / "t.jsonl")
        job_id = self._job({"inputs": [str(data / "a.jsonl"), "data/t.jsonl"], "to": "parquet"})
        assert run_job(job_id) == "succeeded"
        job, events, outputs = self._get(job_id)
        assert job.result["rows_in"] == 10 and job.result["rows_out"] == 11
        assert job.result["formats"] == {"openai": 9, "tree": 1}
        [output] = outputs
        assert output.path.endswith(f"jobs/{job_id}/converted-parquet.parquet")
        assert output.rows == 11 and Path(output.path).exists()
        sev = {e.code: e.level for e in events if e.code}
        assert sev == {"invalid_tool_arguments": "warning"}

    def test_strict_job_fails_with_severity_error(self, migrated: Path) -> None:
        from app.run.job import run_job

        shutil.copy(FIXTURES / "openai_mixed.jsonl", migrated / "data" / "a.jsonl")
        out = migrated / "data" / "out" / "x.jsonl"
        job_id = self._job({"inputs": "data/a.jsonl", "to": "sharegpt", "strict": True, "out": str(out)})
        assert run_job(job_id) == "failed"
        job, events, _ = self._get(job_id)
        assert "--strict" in job.error
        assert {e.code: e.level for e in events if e.code}["invalid_tool_arguments"] == "error"
        assert not out.exists()

    def test_empty_output_job_fails(self, migrated: Path) -> None:
        from app.run.job import run_job

        shutil.copy(FIXTURES / "unknown_keys.jsonl", migrated / "data" / "u.jsonl")
        job_id = self._job({"inputs": ["data/u.jsonl"]})
        assert run_job(job_id) == "failed"
        job, _, _ = self._get(job_id)
        assert "empty output" in job.error and "bar, baz, foo" in job.error

    def test_heavy_losses_raise_alerts(self, migrated: Path) -> None:
        from sqlmodel import select

        from app.run.job import run_job
        from app.store.db import session_scope
        from app.store.models import Alert

        shutil.copy(QUALITY / "short_real_answers.jsonl", migrated / "data" / "s.jsonl")
        shutil.copy(QUALITY / "mostly_rejected.jsonl", migrated / "data" / "m.jsonl")
        dup = self._job({"inputs": ["data/s.jsonl"]})  # 59 of 1,100 rows duplicated: 5.4 %
        quiet = self._job({"inputs": ["data/s.jsonl"], "alert_duplicated": 0.1})
        failed = self._job({"inputs": ["data/m.jsonl"]})
        assert [run_job(j) for j in (dup, quiet, failed)] == ["succeeded", "succeeded", "failed"]
        with session_scope() as session:
            alerts = {(a.job_id, a.kind): a.message for a in session.exec(select(Alert))}
        assert set(alerts) == {(dup, "high_duplicated")}
        assert "59 of 1,100 rows duplicated (5.4%)" in alerts[(dup, "high_duplicated")]
        job, _, _ = self._get(failed)
        assert "5 of 6 rows rejected" in job.error

    def test_paths_outside_roots_refused(self, migrated: Path, tmp_path: Path) -> None:
        from draftdeck.errors import UsageError

        with pytest.raises(UsageError, match="outside the data roots"):
            self._job({"inputs": [str(tmp_path / "x.jsonl")]})
        with pytest.raises(UsageError, match="outside the data roots"):
            self._job({"inputs": ["data"], "out": str(tmp_path / "o.jsonl")})
