"""The `mix` kind through the pages: a recipe typed in the New-job form, the job page's composition
table, the tokenize it offers, the dataset page's mix sources, and "Change the recipe" giving the
recipe back to the form as YAML."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml
from fastapi.testclient import TestClient

from tests.app.run.test_next_steps import _form_values, _next_step, _start, client  # noqa: F401
from tests.support.mix import RECIPE, write_sources
from tests.support.web import form_token


def test_a_recipe_from_the_form_to_a_dataset_with_mix_sources(client: TestClient, migrated: Path) -> None:  # noqa: F811
    from app.run.job import run_job
    from draftdeck.chat.testing import small_bpe_tokenizer

    data = migrated / "data"
    write_sources(data)
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    csrf = form_token(client)
    recipe_text = RECIPE.replace("inputs: [", f"inputs: [{data}/")
    form = client.get("/jobs/new?kind=mix").text
    assert 'name="recipe"' in form and "field-yaml" in form

    # a recipe's inputs are confined to the data roots like every path: one outside is refused by name
    outside = client.post(
        "/jobs",
        data={
            "kind": "mix",
            "csrf": csrf,
            "recipe": recipe_text.replace(f"{data}/chat.jsonl", "/etc/passwd"),
        },
    )
    assert outside.status_code == 400 and "/etc/passwd: outside the data roots" in outside.text
    job = _start(client, "/jobs/new?kind=mix", csrf=csrf, recipe=recipe_text)
    assert run_job(job) == "succeeded"
    page = client.get(f"/jobs/{job}").text
    table = re.search(r'<table id="mix-composition">(.*?)</table>', page, re.S)
    assert table, page
    cells = dict(re.findall(r"<tr[^>]*><td>(\w+)</td>.*?<td class=\"num\">([\d,]+)</td>", table[1], re.S))
    assert cells == {
        "chat": "60",
        "sharegpt": "31",
        "alpaca": "41",
        "claude": "12",
        "table": "25",
        "total": "169",
    }
    assert 'id="mix-duplicates"' in page and "1 of sharegpt against chat" in page

    again = _next_step(page, "Change the recipe")
    recipe = yaml.safe_load(_form_values(client.get(again).text)["recipe"])
    assert [s["name"] for s in recipe["sources"]] == ["chat", "sharegpt", "alpaca", "claude", "table"]
    assert recipe["sources"][3]["max_turns"] == 2 and recipe["seed"] == 11

    tokenize = _start(client, _next_step(page, "Tokenize this"), csrf=csrf, tokenizer=str(tok))
    assert run_job(tokenize, in_process=True) == "succeeded"
    [ds_id] = re.findall(r'href="/datasets/(\d+)">Open dataset', client.get(f"/jobs/{tokenize}").text)
    ds = client.get(f"/datasets/{ds_id}").text
    mixed = re.search(r'<table[^>]*id="mix-sources">(.*?)</table>', ds, re.S)
    assert mixed, "the dataset page has no mix sources table"
    rows = dict(re.findall(r"<tr><td>(\w+)</td><td class=\"num\">([\d,]+)</td>", mixed[1]))
    assert rows == {"chat": "20", "sharegpt": "43", "alpaca": "40", "claude": "25", "table": "14"}
    # an upsampled source's repeats are declared (draftdeck_source.repeat): not duplicates, no alert
    assert "duplicate_conversation" not in ds and "High Duplicated" not in ds
