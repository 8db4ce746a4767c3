"""`mix`: the recipe (errors by line), the plan's exact amounts, a five-shape mix whose composition
balances and whose bytes are the same for 1 and 2 workers, the CLI, and the policy over the mix."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftdeck.cli import app
from draftdeck.convert import ConvertOptions
from draftdeck.errors import JobFailed, UsageError
from draftdeck.mix import Recipe, mix, plan_rows
from draftdeck.mix.composition import composition
from draftdeck.quality import Policy, Report
from tests.support.mix import RECIPE, write_sources


def _recipe(folder: Path, text: str = RECIPE) -> Recipe:
    return Recipe.from_yaml(text, "recipe.yaml", base=folder)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "seed: 1\nsources:\n  - name: a\n    inputs: [chat.jsonl]\n    rows: 3\n    weigth: 0.2\n",
            "recipe.yaml line 6: unknown key 'weigth'",
        ),
        (
            "seed: 1\nsources:\n  - name: a\n    inputs: [chat.jsonl]\n    rows: 3\n    weight: 0.2\n",
            "recipe.yaml line 3: source 'a' needs exactly one of rows, weight or all"
            " (it has rows and weight)",
        ),
        (
            "seed: 1\nsources:\n  - name: a\n    inputs: [chat.jsonl]\n    weight: 0.7\n"
            "  - name: b\n    inputs: [alpaca.jsonl]\n    weight: 0.5\n",
            "recipe.yaml line 2: the weights sum to 1.2, over 1",
        ),
        (
            "seed: 1\nsources:\n  - name: a\n    inputs: [chat.jsonl]\n    all: true\n  - name: b\n"
            "    inputs:\n      - alpaca.jsonl\n      - nope.jsonl\n    rows: 2\n",
            "recipe.yaml line 9: source 'b': nope.jsonl: no such file or directory",
        ),
        (
            "sources:\n  - name: a\n    inputs: [chat.jsonl]\n    all: true\n",
            "recipe.yaml line 1: seed is required",
        ),
        (
            "seed: 1\nsources:\n  - name: a\n    inputs: [chat.jsonl]\n    all: true\n"
            "    columns: {answer: tgt}\n",
            "recipe.yaml line 3: source 'a': --columns: unknown key answer (known: prompt, query, response,"
            " reasoning, system, history, tools, messages)",
        ),
    ],
)
def test_a_bad_recipe_names_its_line(tmp_path: Path, text: str, said: str) -> None:
    write_sources(tmp_path)
    with pytest.raises(UsageError) as err:
        _recipe(tmp_path, text)
    assert str(err.value) == said


def test_the_plan_gives_exact_integers() -> None:
    def plan(text: str, available: list[int]) -> list[int]:
        return plan_rows(Recipe.from_yaml(text), available)

    two = "  - name: a\n    inputs: [x]\n    {a}\n  - name: b\n    inputs: [y]\n    {b}\n"
    # weights beside a fixed source: the mix is rows / (1 - weights)
    assert plan("seed: 0\nsources:\n" + two.format(a="rows: 60", b="weight: 0.4"), [100, 10]) == [60, 40]
    # only weights: the largest mix that repeats no row (b limits it: 30 / 0.3 = 100)
    assert plan("seed: 0\nsources:\n" + two.format(a="weight: 0.7", b="weight: 0.3"), [500, 30]) == [70, 30]
    # a total split by largest remainder
    text = "seed: 0\ntotal: 10\nsources:\n" + two.format(a="weight: 0.55", b="weight: 0.45")
    assert plan(text, [9, 9]) == [6, 4]  # 5.5 and 4.5: the remainder's tie goes to the first
    with pytest.raises(UsageError, match="is not 10"):  # a total the amounts cannot make
        plan("seed: 0\ntotal: 10\nsources:\n" + two.format(a="rows: 8", b="weight: 0.5"), [9, 9])
    with pytest.raises(UsageError, match="source 'a' \\(rows 3\\) has no row left"):
        plan("seed: 0\nsources:\n" + two.format(a="rows: 3", b="all: true"), [0, 5])


def test_five_shapes_balance_per_source_and_are_the_same_bytes_with_two_workers(tmp_path: Path) -> None:
    write_sources(tmp_path)
    recipe = _recipe(tmp_path)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    rep = mix(recipe, one, options=ConvertOptions(workers=1))
    # tiny ranges, so the two workers really cut the JSONL sources into chunks
    rep2 = mix(recipe, two, options=ConvertOptions(workers=2, chunk_bytes=512))
    assert one.read_bytes() == two.read_bytes()
    assert rep2.to_dict()["mix"] == rep.to_dict()["mix"]

    table = {r["name"]: r for r in composition(rep.extra["mix"])}
    assert all(r["balanced"] for r in table.values())
    assert {n: (r["rows_in"], r["taken"], r["repeated"], r["rows_out"]) for n, r in table.items()} == {
        "chat": (60, 20, 0, 20),  # a quota drawn from 60: 40 not drawn
        "sharegpt": (31, 30, 13, 43),  # weight 0.3 of 142, one duplicate of chat's removed: upsampled
        "alpaca": (41, 40, 0, 40),  # all; one row of no known shape rejected
        "claude": (12, 10, 15, 25),  # two rows over max_turns filtered; 25 from 10: 15 repeats
        "table": (25, 14, 0, 14),  # weight 0.1 of 142
        "total": (169, 114, 28, 142),
    }
    assert table["sharegpt"]["duplicates_against"] == {"chat": 1}
    assert table["claude"]["rejected"] == {"filtered_out": 2}
    assert table["alpaca"]["rejected"] == {"unknown_format": 1}
    assert table["chat"]["not_sampled"] == 40 and table["table"]["not_sampled"] == 11
    assert abs(table["sharegpt"]["share"] - 43 / 142) < 1e-9

    rows = _lines(one)
    assert len(rows) == 142 == rep.rows_out
    by_source: dict[str, int] = {}
    for r in rows:
        prov = r["draftdeck_source"]
        assert set(prov) - {"repeat"} == {"file", "row", "source"} and "messages" in r
        by_source[prov["source"]] = by_source.get(prov["source"], 0) + 1
    assert by_source == {"chat": 20, "sharegpt": 43, "alpaca": 40, "claude": 25, "table": 14}
    # each repeat says which it is: 13 of sharegpt's 30 once more; claude's 10 twice more, then 5 again
    repeats = Counter((r["draftdeck_source"]["source"], r["draftdeck_source"].get("repeat", 0)) for r in rows)
    assert {k: n for k, n in repeats.items() if k[1]} == {
        ("sharegpt", 1): 13,
        ("claude", 1): 10,
        ("claude", 2): 5,
    }
    assert [r["draftdeck_source"]["source"] for r in rows[:20]] != ["chat"] * 20  # interleaved, not in blocks
    dup = rep.examples["duplicate_removed"][0]
    assert dup.file.endswith("sharegpt.jsonl") and dup.line == 31 and "source 'chat'" in dup.reason
    assert "chat.jsonl:4" in dup.reason
    assert rep.warnings["upsampled"] == 28
    rep.check_accounting()


def test_the_seed_decides_the_draw(tmp_path: Path) -> None:
    write_sources(tmp_path)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    mix(_recipe(tmp_path), a)
    mix(_recipe(tmp_path, RECIPE.replace("seed: 11", "seed: 12")), b)
    assert a.read_bytes() != b.read_bytes()
    assert sorted(a.read_bytes().splitlines()) != sorted(b.read_bytes().splitlines())  # other rows drawn


def test_sharegpt_and_parquet_outputs_keep_the_source(tmp_path: Path) -> None:
    write_sources(tmp_path)
    sg = tmp_path / "m.jsonl"
    mix(_recipe(tmp_path, RECIPE.replace("seed: 11", "seed: 11\nto: sharegpt")), sg)
    first = _lines(sg)[0]
    assert "conversations" in first and first["draftdeck_source"]["source"]
    pq_out = tmp_path / "m.parquet"
    rep = mix(_recipe(tmp_path, RECIPE.replace("seed: 11", "seed: 11\nto: parquet")), pq_out)
    import pyarrow.parquet as pq

    metas = [json.loads(m) for m in pq.read_table(pq_out).column("meta").to_pylist()]
    assert len(metas) == rep.rows_out == 142
    assert {m["draftdeck_source"]["source"] for m in metas} == {
        "chat",
        "sharegpt",
        "alpaca",
        "claude",
        "table",
    }


def test_policy_runs_over_the_mix_and_an_empty_mix_fails(tmp_path: Path) -> None:
    write_sources(tmp_path)
    out = tmp_path / "m.jsonl"
    with pytest.raises(JobFailed, match=r"upsampled.*--strict"):  # strict: a repeat is an error too
        mix(_recipe(tmp_path), out, Policy(strict=True))
    assert not out.exists()
    nothing = "seed: 1\nsources:\n  - name: a\n    inputs: [chat.jsonl]\n    all: true\n    min_turns: 9\n"
    with pytest.raises(JobFailed, match="no rows were written") as err:
        mix(_recipe(tmp_path, nothing), out)
    assert isinstance(err.value.report, Report)
    assert err.value.report.rejected["filtered_out"] == 60 and not out.exists()
    assert not list(tmp_path.glob(".m.jsonl.mix-*"))  # no temporary folder left behind


def test_cli_prints_the_composition_and_exits_by_the_rules(tmp_path: Path) -> None:
    write_sources(tmp_path)
    (tmp_path / "r.yaml").write_text(RECIPE)
    out, rep = tmp_path / "m.jsonl", tmp_path / "rep.json"
    result = CliRunner().invoke(
        app, ["mix", str(tmp_path / "r.yaml"), "--out", str(out), "--report", str(rep), "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    assert (
        "composition (seed 11)" in result.output
        and "sharegpt: 1 duplicates of rows kept from chat" in result.output
    )
    total = [line for line in result.output.splitlines() if line.startswith("total")]
    assert total and "142" in total[0] and "100.0%" in total[0]
    assert json.loads(rep.read_text())["mix"]["sources"][0]["name"] == "chat"
    (tmp_path / "bad.yaml").write_text(RECIPE.replace("rows: 20", "rows: 20\n    colour: red"))
    bad = CliRunner().invoke(app, ["mix", str(tmp_path / "bad.yaml"), "--out", str(out)])
    assert bad.exit_code == 2 and "line 6: unknown key 'colour'" in bad.output


@pytest.mark.parametrize(
    "row",
    [
        {
            "messages": [{"role": "user", "content": 'a ,"draftdeck_source": b'}],
            "draftdeck_source": {"file": "f", "row": 3},
        },
        {"draftdeck_source": {"file": "f", "row": 3}, "messages": [], "id": "provenance not last"},
        {"messages": [], "draftdeck_source": {"file": "f", "row": 3, "source": "mixed before"}},
        {"messages": []},
    ],
)
def test_naming_a_line_gives_the_bytes_of_a_full_rewrite(row: dict) -> None:
    from draftdeck.formats.writers import encode_line
    from draftdeck.mix.rows import named_line, with_source

    line = encode_line(row)
    assert named_line(line, b"chat") == encode_line(with_source(json.loads(line), "chat"))
    assert named_line(line, b"chat", 2) == encode_line(with_source(json.loads(line), "chat", 2))
    assert json.loads(named_line(line, b"chat"))["draftdeck_source"]["source"] == "chat"


def test_copies_in_one_source_and_across_are_each_counted_against_the_first(tmp_path: Path) -> None:
    def chat(q: str) -> str:
        return json.dumps(
            {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": q * 2}]}
        )

    (tmp_path / "a.jsonl").write_text("\n".join(chat(q) for q in "xyxwx") + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(chat(q) for q in "yzw") + "\n")
    text = "seed: 0\nsources:\n" + "".join(
        f"  - name: {n}\n    inputs: [{n}.jsonl]\n    all: true\n" for n in "ab"
    )
    rep = mix(_recipe(tmp_path, text), tmp_path / "m.jsonl")
    a, b, _ = composition(rep.extra["mix"])
    assert (a["duplicates_against"], b["duplicates_against"]) == ({"a": 2}, {"a": 2})
    assert (a["taken"], b["taken"]) == (3, 1)
    answers = sorted(
        json.loads(x)["messages"][1]["content"] for x in (tmp_path / "m.jsonl").read_text().splitlines()
    )
    assert answers == ["ww", "xx", "yy", "zz"]
    assert [(e.file.rsplit("/", 1)[-1], e.line) for e in rep.examples["duplicate_removed"]] == [
        ("a.jsonl", 3),
        ("a.jsonl", 5),
        ("b.jsonl", 1),
        ("b.jsonl", 3),
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_declared_repeats_are_not_duplicates_to_convert_but_copies_still_are(
    tmp_path: Path, workers: int
) -> None:
    from draftdeck.convert import convert

    def row(i: int, **prov: object) -> str:
        msgs = [
            {"role": "user", "content": f"question {i} " * 4},
            {"role": "assistant", "content": f"answer {i} " * 9},
        ]
        return json.dumps({"messages": msgs, "draftdeck_source": {"file": "a.jsonl", "row": i, **prov}})

    lines = [row(i, source="a") for i in range(40)] + [row(i, source="a", repeat=1) for i in range(40)]
    lines.append(row(0, source="a"))  # a real copy of row 0
    src = tmp_path / "mixed.jsonl"
    src.write_text("\n".join(lines) + "\n")
    rep = convert(
        [src], tmp_path / "o.jsonl", "sharegpt", options=ConvertOptions(workers=workers, chunk_bytes=2048)
    )
    assert rep.warnings["duplicate_conversation"] == 1 and rep.rows_out == 81
    kept = [json.loads(x)["draftdeck_source"] for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert sum(1 for p in kept if p.get("repeat") == 1) == 40 and {p["source"] for p in kept} == {"a"}


def test_a_source_declares_its_columns(tmp_path: Path) -> None:
    """A source of a shape no reader guesses ({src, tgt}) reads by its own mapping beside a detected one."""
    write_sources(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"src": f"say {i}", "tgt": f"the answer number {i}"}) + "\n"
                             for i in range(5)))  # fmt: skip
    text = ("seed: 1\nsources:\n  - name: chat\n    inputs: [chat.jsonl]\n    all: true\n"
            "  - name: pairs\n    inputs: [pairs.jsonl]\n    all: true\n"
            "    columns: {prompt: src, response: tgt}\n")  # fmt: skip
    out = tmp_path / "m.jsonl"
    report = mix(_recipe(tmp_path, text), out)
    rows = [r for r in _lines(out) if r["draftdeck_source"]["source"] == "pairs"]
    assert len(rows) == 5 and report.formats["columns"] == 5
    assert rows[0]["messages"][0]["content"].startswith("say ")
