from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftdeck.errors import AccountingError, PolicyError
from draftdeck.issue_codes import CODES, Action, code
from draftdeck.quality import Output, Policy, Report


def _report(rows_in: int, out: int, **rejected: int) -> Report:
    r = Report(rows_in=rows_in, rows_out=out)
    for name, n in rejected.items():
        for i in range(n):
            r.reject(name, "f.jsonl", i + 1, "why")
    return r


class TestAccounting:
    def test_balanced_report_passes(self) -> None:
        _report(5, 3, json_error=2).check_accounting()

    def test_lost_row_is_an_error_naming_both_sides(self) -> None:
        with pytest.raises(AccountingError, match=r"rows_in 5 .* rejected 1"):
            _report(5, 3, json_error=1).check_accounting()

    def test_expanded_rows_balance_trees(self) -> None:
        r = _report(2, 4)
        r.rows_expanded = 2
        r.check_accounting()

    def test_outputs_must_hold_rows_out(self) -> None:
        r = _report(2, 2)
        r.outputs.append(Output("x", 1, 10, "0" * 64))
        with pytest.raises(AccountingError, match="outputs hold 1 rows"):
            r.check_accounting()

    def test_examples_are_capped_and_merge_adds_counts(self) -> None:
        a, b = _report(10, 0, json_error=10), _report(3, 1, unknown_format=2)
        assert len(a.examples["json_error"]) == 5
        a.merge(b)
        assert (a.rows_in, a.rows_out, a.rejected["unknown_format"], a.rejected["json_error"]) == (
            13,
            1,
            2,
            10,
        )

    def test_report_shape(self, tmp_path: Path) -> None:
        r = _report(2, 1, json_error=1)
        r.formats["openai"] = 1
        r.warn("truncated", "f.jsonl", 2, "cut at 4096")
        r.write_json(tmp_path / "r.json")
        data = json.loads((tmp_path / "r.json").read_text())
        assert {"rows_in", "rows_out", "rejected", "warnings", "formats", "outputs", "examples"} <= set(data)
        assert data["examples"]["json_error"] == [{"file": "f.jsonl", "line": 1, "reason": "why"}]
        assert data["warnings"] == {"truncated": 1}

    def test_unknown_code_is_refused(self) -> None:
        with pytest.raises(KeyError, match="unknown issue code 'nope'"):
            Report().reject("nope", "f", 1, "x")


class TestPolicy:
    def test_empty_output_always_fails(self) -> None:
        assert [f.code for f in Policy().failures(_report(0, 0))] == ["empty_output"]
        assert [f.code for f in Policy().failures(_report(3, 0, json_error=3))] == ["empty_output"]

    def test_defaults_pass_rejections_and_warnings(self) -> None:
        r = _report(4, 3, json_error=1)
        r.warn("trailing_user_turn", "f", 1, "x")
        assert Policy().failures(r) == []

    def test_strict_turns_warnings_into_errors(self) -> None:
        r = _report(4, 4)
        r.warn("trailing_user_turn", "f", 1, "x")
        assert [f.code for f in Policy(strict=True).failures(r)] == ["trailing_user_turn"]
        assert Policy(strict=True).severity("trailing_user_turn") == "error"
        assert Policy().severity("trailing_user_turn") == "warning"
        assert Policy().severity("json_error") == "rejected"

    def test_max_rejected_fraction(self) -> None:
        r = _report(10, 7, json_error=3)
        assert Policy(max_rejected=0.5).failures(r) == []
        [fail] = Policy(max_rejected=0.2).failures(r)
        assert fail.code == "max_rejected" and "30.0%" in fail.reason

    def test_thresholds_from_a_policy_file(self, tmp_path: Path) -> None:
        path = tmp_path / "policy.json"
        path.write_text(
            json.dumps(
                {
                    "codes": {
                        "truncated": {"action": "warn", "max_fraction": 0.1},
                        "duplicate_conversation": "fail",
                    }
                }
            )
        )
        policy = Policy.from_file(path)
        assert policy.action("duplicate_conversation") is Action.FAIL
        r = _report(10, 10)
        r.warn("truncated", "f", 1, "x", n=2)
        assert [f.code for f in policy.failures(r)] == ["truncated"]

    def test_bad_policy_files_say_what_is_wrong(self, tmp_path: Path) -> None:
        with pytest.raises(PolicyError, match="unknown policy keys: colour"):
            Policy.from_dict({"colour": "red"})
        with pytest.raises(PolicyError, match="not valid"):
            Policy.from_dict({"codes": {"truncated": {"action": "explode"}}})
        with pytest.raises(PolicyError, match="cannot read policy file"):
            Policy.from_file(tmp_path / "missing.json")

    def test_every_code_has_a_description(self) -> None:
        assert all(c.description for c in CODES.values())
        assert code("json_error").action is Action.REJECT


class TestLosses:
    def test_figures_thresholds_and_alerts(self) -> None:
        r = _report(100, 90, json_error=10)
        r.warn("duplicate_conversation", "f.jsonl", 3, "again", n=4)
        r.warn("truncated", "f.jsonl", 4, "cut", n=6)
        pol = Policy(max_rejected=0.5, alert_rejected=0.05, alert_duplicated=0.05, alert_truncated=0.05)
        losses = pol.losses(r)
        assert losses["rejected"] == {
            "rows": 10, "of": 100, "share": 0.1, "alert_above": 0.05, "fail_above": 0.5,
            "alert": "10 of 100 rows rejected (10.0%), above the alert threshold 5%",
        }  # fmt: skip
        assert "alert" not in losses["duplicated"] and losses["duplicated"]["rows"] == 4
        assert pol.loss_alerts(r) == [
            ("high_rejected", losses["rejected"]["alert"]),
            ("high_truncation", "6 of 100 rows truncated (6.0%), above the alert threshold 5%"),
        ]
        assert Policy().loss_alerts(r) == []  # no thresholds: figures only

    def test_thresholds_from_flags_and_files(self, tmp_path: Path) -> None:
        pol = Policy.build(None, max_rejected=0.5, alert_rejected=0.1, alert_truncated=None)
        assert (pol.max_rejected, pol.alert_rejected, pol.alert_truncated) == (0.5, 0.1, None)
        with pytest.raises(PolicyError, match="alert_lost"):
            Policy.build(None, alert_lost=0.1)
        path = tmp_path / "p.json"
        path.write_text(json.dumps({"alert_duplicated": 0.2}))
        assert Policy.from_file(path).alert_duplicated == 0.2


class TestPlaceholderRule:
    def test_fillers_need_a_few_prompts_other_answers_a_share(self) -> None:
        from draftdeck.convert.placeholders import PlaceholderRule, normalise

        rule = PlaceholderRule()
        assert [normalise(t) for t in ("OK.", " Okay! ", "...", "N/A", "…")] == ["ok", "okay", "", "n/a", "…"]
        assert rule.passes(("ok",), 3, 1_000_000) and not rule.passes(("ok",), 2, 2)
        assert not rule.passes(("yes",), 40, 1040)  # 3.8 % of the rows
        assert rule.passes(("yes",), 40, 150) and not rule.passes(("yes",), 31, 31)
        assert rule.passes(("ok", "ok"), 3, 10) and not rule.passes(("ok", "sure"), 3, 10)
