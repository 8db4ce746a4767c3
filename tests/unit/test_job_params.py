"""Each kind's parameters are defined once: the CLI's options, the core's options, the API schema and
the form fields all come from the one model."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.main import get_command

from draftdeck.cli import make_app
from draftdeck.convert.job import ConvertParams
from draftdeck.kinds import KINDS
from draftdeck.tokenize.job import TokenizeParams
from tests.support.web import form_token

CLI_ONLY = {"report", "workers", "report_to"}  # the CLI's own options, not job parameters
NOT_ON_THE_CLI = {"tokenize": {"chunk_rows"}}  # chunk tasks are the service's


def _options(name: str) -> dict[str, list[str]]:
    app: typer.Typer = make_app()
    command = get_command(app).commands[name]  # type: ignore[attr-defined]
    return {p.name: list(p.opts) for p in command.params}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_parameter_is_a_cli_option_of_its_command(kind: str) -> None:
    fields = set(KINDS[kind].params.model_fields) - NOT_ON_THE_CLI.get(kind, set())
    options = _options(kind)
    assert set(options) - CLI_ONLY == fields
    for name in fields - {"inputs", "recipe"}:  # the positional arguments (mix's RECIPE is a file)
        extra = KINDS[kind].params.model_fields[name].json_schema_extra
        flag = extra.get("cli_flag") if isinstance(extra, dict) else None  # e.g. --endpoint (repeated)
        assert (flag or f"--{name.replace('_', '-')}") in options[name]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_names_its_inputs_and_output_alike(kind: str) -> None:
    params = KINDS[kind].params
    if kind == "mix":  # its inputs are its recipe's sources' (confined by the kind itself)
        assert "recipe" in params.model_fields and "inputs" not in params.model_fields
    elif kind == "tiny-target":  # it builds from nothing
        assert not params.input_paths
    else:
        assert "inputs" in params.model_fields and "inputs" in params.input_paths
    assert not {"path", "paths"} & set(params.model_fields)
    # train's hidden_states_cache: the cache a run builds first when it is not there (read after)
    assert set(params.output_paths) <= {"out", "hidden_states_cache"}


def test_the_cli_help_comes_from_the_field_descriptions() -> None:
    app = make_app()
    command = get_command(app).commands["tokenize"]  # type: ignore[attr-defined]
    helps = {p.name: getattr(p, "help", None) for p in command.params}
    assert helps["seq_length"] == TokenizeParams.model_fields["seq_length"].description


def test_core_options_are_built_from_the_parameters() -> None:
    params = TokenizeParams(inputs=["a.jsonl"], tokenizer="tok", seq_length=64, shard_rows=7, encoder="hf",
                            template_kwargs={"enable_thinking": False})  # fmt: skip
    opts = params.options(workers=3)
    assert (opts.tokenizer, opts.seq_length, opts.shard_rows, opts.encoder, opts.workers) == (
        Path("tok"), 64, 7, "hf", 3,
    )  # fmt: skip
    assert opts.template_kwargs == {"enable_thinking": False}
    convert = ConvertParams(inputs=["a.jsonl"], tree_paths="best", max_row_bytes=1024, strict=True).options()
    assert (convert.tree_paths, convert.max_row_bytes, convert.policy.strict) == ("best", 1024, True)


def test_form_fields_and_api_schema_are_the_model(migrated: Path) -> None:
    from fastapi.testclient import TestClient

    from app.web.job_views import form_fields
    from app.web.main import app

    kinds = TestClient(app).get("/api/kinds").json()
    for name, kind in KINDS.items():
        assert set(kinds[name]["params"]["properties"]) == set(kind.params.model_fields)
        assert [f["name"] for f in form_fields(name)] == list(kind.params.model_fields)


def test_each_kinds_run_works_on_a_local_context(tmp_path: Path) -> None:
    """`run(params, ctx)` is the whole contract: the core runs a kind with any RunContext."""
    import json

    from draftdeck.jobs.context import LocalContext

    src = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(3)
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scan = KINDS["scan"]
    ctx = LocalContext(tmp_path / "scan-job")
    report = scan.run(scan.params.model_validate({"inputs": [str(src), str(src)]}), ctx)
    assert (report.rows_in, report.rows_out) == (6, 6) and len(report.extra["files"]) == 2
    assert report.extra["keysets"] == [{"keys": ["messages"], "rows": 6}]
    assert ctx.last_progress is not None and ctx.last_progress[2] == "bytes"
    convert = KINDS["convert"]
    ctx = LocalContext(tmp_path / "convert-job")
    report = convert.run(convert.params.model_validate({"inputs": str(src), "to": "openai"}), ctx)
    [out] = report.outputs
    assert out.path == str(ctx.out_dir / "converted-openai.jsonl") and out.rows == 3


def test_template_kwargs_take_one_syntax_everywhere(migrated: Path) -> None:
    """KEY=VALUE pairs, parsed in one place (the model): the CLI's repeated -k, the form's lines,
    `jobs submit -p template_kwargs=K=V` (one string) and the API's JSON object mean the same."""
    from fastapi.testclient import TestClient
    from pydantic import ValidationError

    from app.web.job_views import form_params
    from app.web.main import create_app
    from draftdeck.cli.options import params_from

    want = {"enable_thinking": False, "effort": "high", "budget": 3}
    base = {"inputs": ["a.jsonl"], "tokenizer": "tok"}
    cli = params_from(TokenizeParams, {**base, "template_kwargs": ["enable_thinking=false", "effort=high",
                                                                  "budget=3"]})  # fmt: skip
    assert isinstance(cli, TokenizeParams)
    from_form, _ = form_params(
        "tokenize",
        {
            "inputs": "a.jsonl",
            "tokenizer": "tok",
            "template_kwargs": "enable_thinking=false\r\neffort = high\n\nbudget=3\n",
        },
    )
    form = TokenizeParams.model_validate(from_form)
    submit = TokenizeParams.model_validate(
        {**base, "template_kwargs": "enable_thinking=false\neffort=high\nbudget=3"}
    )
    api = TokenizeParams.model_validate({**base, "template_kwargs": want})
    assert (
        cli.template_kwargs == form.template_kwargs == submit.template_kwargs == api.template_kwargs == want
    )
    with pytest.raises(ValidationError) as bad:
        TokenizeParams.model_validate({**base, "template_kwargs": "enable_thinking"})
    assert bad.value.errors()[0]["loc"] == ("template_kwargs",)
    assert "takes KEY=VALUE pairs (e.g. enable_thinking=false), got 'enable_thinking'" in str(bad.value)
    # the form shows the kind's pairs as lines, and refuses a line without "=" naming the field
    with TestClient(create_app()) as client:
        page = client.get("/jobs/new?kind=tokenize")
        assert 'name="template_kwargs"' in page.text and "one KEY=VALUE a line" in page.text
        csrf = form_token(client)
        form_data = {"kind": "tokenize", "csrf": csrf, "inputs": "a.jsonl", "tokenizer": "tok",
                     "template_kwargs": "enable_thinking"}  # fmt: skip
        r = client.post("/jobs", data=form_data)
        assert r.status_code == 400 and "takes KEY=VALUE pairs" in r.text
