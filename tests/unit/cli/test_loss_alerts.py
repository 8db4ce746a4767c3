"""What an in-process command prints for a loss past its alert threshold: the alert's own name, the one
the job raises, the docs list and /alerts shows (the CLI said `high_truncated` for `high_truncation`)."""

from __future__ import annotations

import pytest

from draftdeck.cli.common import print_report
from draftdeck.quality import Policy, Report


def test_a_truncation_alert_prints_under_the_name_the_job_raises(capsys: pytest.CaptureFixture[str]) -> None:
    report = Report(rows_in=10, rows_out=10)
    for line in (1, 2, 3):
        report.warn("truncated", "chats.jsonl", line, "cut at seq_length 64")
    policy = Policy(alert_truncated=0.05)
    report.extra["losses"] = policy.losses(report)
    print_report(report, "tokenize chats.jsonl")
    said = capsys.readouterr().err
    [(raised, _)] = policy.loss_alerts(report)
    assert raised == "high_truncation" and f"alert {raised}:" in said
    assert "high_truncated" not in said and "3 of 10 rows truncated (30.0%)" in said
