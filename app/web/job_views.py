"""What the job pages show, built from SQL and the job kinds: the form's fields from a kind's parameter
model, a job's context (log, issues, outputs, next steps), links to the New-job form prefilled.
Routes are in app/web/jobs.py; nothing here renders."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml
from fastapi import HTTPException
from sqlmodel import Session, col, select

from app.run import liveness
from app.run.report_items import shown_result
from app.settings import get_settings
from app.store import records
from app.store.models import Alert, Dataset, Job, JobEvent, JobOutput, JobStatus
from draftdeck.errors import UsageError
from draftdeck.kinds import KINDS
from draftdeck.units import duration

LOG_TAIL = 200


JOBS_SHOWN = 100


def job_inputs(job: Job) -> list[str]:
    """The data a job reads, in order: what identifies it in a list. Only `inputs` (every kind names
    its data so): a tokenizer, target model or policy file is a parameter, not one more input."""
    value = job.params.get("inputs")
    return [str(v) for v in (value if isinstance(value, list) else [value]) if v is not None]


def inputs_changed_since(job: Job) -> bool:
    """Whether a file the job read (an input, or a file inside an input folder) changed after the job
    started: then the same parameters can end differently, and a retry makes sense."""
    start = job.started_at or job.created_at
    since = start.replace(tzinfo=start.tzinfo or UTC).timestamp()
    for name in job_inputs(job):
        path = Path(name)
        try:
            files = [path, *path.iterdir()] if path.is_dir() else [path]
            if any(f.stat().st_mtime > since for f in files):
                return True
        except OSError:  # gone or unreadable: the retry would say so
            continue
    return False


_FLAG = re.compile(r"(?:\b(?:pass|use|with|set)\s+)?--([a-z][a-z0-9-]*)(?:\s+([A-Za-z0-9_.]+))?")


def form_words(text: str | None, kind_name: str) -> str:
    """A message of the core (written for the CLI: "pass --on-missing drop") in the form's words ("set
    on_missing to drop in the form"), for the kind's fields; other text is left as it is."""
    if not text:
        return ""
    kind = KINDS.get(kind_name)
    if kind is None:
        return text
    fields = {f["name"]: f for f in form_fields(kind_name)}

    def say(m: re.Match[str]) -> str:
        name, value = m.group(1).replace("-", "_"), m.group(2)
        field = fields.get(name)
        if field is None:
            return m.group(0)
        if field["widget"] == "checkbox":
            return f"tick “{name}” in the form" + (f" {value}" if value else "")
        if value is not None and value in field["options"]:
            return f"set “{name}” to {value} in the form"
        return f"“{name}” (in the form)" + (f" {value}" if value else "")

    return _FLAG.sub(say, text)


def new_job_link(kind: str, params: Mapping[str, Any]) -> str:
    """The New-job form of `kind` prefilled with `params` (lists repeat their key)."""
    query: list[tuple[str, str]] = [("kind", kind)]
    yaml_fields = {f["name"] for f in form_fields(kind) if f["widget"] == "yaml"} if kind in KINDS else set()
    for name, value in params.items():
        if value is None or value == [] or value == {}:
            continue
        if name in yaml_fields and isinstance(value, dict):  # a recipe: back as the YAML it was typed as
            query.append((name, yaml_text(value)))
        elif isinstance(value, list):
            query.extend((name, str(v)) for v in value)
        elif isinstance(value, dict):  # KEY=VALUE lines, as the form's pairs field takes them
            query.extend((name, f"{k}={json.dumps(v)}") for k, v in value.items())
        elif isinstance(value, bool):
            query.append((name, "true" if value else "false"))
        else:
            query.append((name, str(value)))
    return "/jobs/new?" + urlencode(query)


OFF_TARGET = "data_not_target_output"
# what a scan shares with the convert it checks for: how the rows are read
SCAN_READING = ("from_format", "columns", "tags", "tool_tags", "preference")


def regenerate_with_target(job: Job) -> str:
    """The New-job form of a `regenerate` job in which a train job's target answers the conversations
    its datasets were tokenized from (the fix for data_not_target_output), prefilled."""
    from draftdeck.errors import InputError
    from draftdeck.shards.manifest import read_manifest

    target = job.params.get("target")
    sources: list[str] = []
    for folder in job_inputs(job):
        try:
            sources += read_manifest(Path(folder)).inputs
        except InputError:
            continue
    params: dict[str, Any] = {"local": target, "temperature": 0}
    if sources:
        first = Path(sources[0])
        params |= {
            "inputs": sources,
            "out": str(first.with_name(f"{first.stem}.by-{Path(str(target)).name}.jsonl")),
        }
    return new_job_link("regenerate", params)


def next_steps(
    job: Job, outputs: Sequence[JobOutput], datasets: Sequence[Dataset], alerts: Sequence[Alert] = ()
) -> list[tuple[str, str]]:
    """(label, link) of what a user does after this job, where they are: a scanned file is converted,
    a converted file tokenized, a tokenized dataset opened; a failed job is changed and started again;
    a run told its data is not its target's output regenerates it with the target (while it runs too)."""
    inputs = job_inputs(job)
    files = [o.path for o in outputs]
    fixes = []
    if job.kind == "train" and any(a.kind == OFF_TARGET for a in alerts):
        fixes = [("Regenerate with this target", regenerate_with_target(job))]
    if job.status == JobStatus.SUCCEEDED:
        if job.kind == "scan" and inputs:  # read as the scan read it: its mapping and reading choices
            read_as = {k: job.params.get(k) for k in SCAN_READING}
            proposal = (job.result or {}).get("suggested_mapping")
            if proposal and proposal.get("why") == "unread_text":  # read by fields that hold little of it
                mapped = {"inputs": inputs, **read_as, **{k: proposal[k] for k in ("columns", "tags")}}
                return [("Convert with the proposed mapping", new_job_link("convert", mapped)),
                        ("Scan with the proposed mapping", new_job_link("scan", mapped))]  # fmt: skip
            return [("Convert this", new_job_link("convert", {"inputs": inputs, **read_as}))]
        if job.kind == "convert" and files:
            return [("Tokenize this", new_job_link("tokenize", {"inputs": files}))]
        if job.kind == "mix" and files:  # re-weighting after the per-source figures is the next loop
            return [("Tokenize this", new_job_link("tokenize", {"inputs": files})),
                    ("Change the recipe", new_job_link("mix", job.params))]  # fmt: skip
        if job.kind == "sweep":  # its points charted, and the flags of the one to serve
            return [("Open the sweep", f"/sweeps/{job.id}")]
        if job.kind == "tokenize" and datasets:
            return [(f"Open dataset {d.name}", f"/datasets/{d.id}") for d in datasets]
        return fixes
    if job.status == JobStatus.FAILED and job.kind in KINDS:
        proposal = (job.result or {}).get("suggested_mapping") if job.kind == "scan" else None
        if proposal:  # no row of the input was readable: try the proposed mapping first
            mapped = {**job.params, "columns": proposal["columns"], "tags": proposal["tags"]}
            fixes = [*fixes, ("Scan with the proposed mapping", new_job_link("scan", mapped))]
        return [*fixes, ("Change and start again", new_job_link(job.kind, job.params))]
    return fixes


def yaml_text(value: Any) -> str:
    """A mapping as block YAML, its unset (None) values left out."""

    def bare(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: bare(x) for k, x in v.items() if x is not None}
        return [bare(x) for x in v] if isinstance(v, list) else v

    return yaml.safe_dump(bare(value), sort_keys=False, allow_unicode=True)


def job_duration(job: Job) -> str | None:
    if job.started_at is None or job.finished_at is None:
        return None
    return duration((job.finished_at - job.started_at).total_seconds())


def recent_jobs(session: Session) -> list[Job]:
    return list(session.exec(select(Job).order_by(col(Job.id).desc()).limit(JOBS_SHOWN)).all())


def form_fields(kind_name: str) -> list[dict[str, Any]]:
    """One form field per parameter, from the kind's JSON schema: text, number, checkbox, a select
    for enums and a textarea (one value a line) for lists. Optional (`X | None`) fields are X fields
    that may stay empty."""
    kind = KINDS[kind_name]
    schema = kind.params.model_json_schema()
    required = set(schema.get("required", []))
    fields = []
    for name, spec in schema.get("properties", {}).items():
        options = [o for o in spec.get("anyOf", [spec]) if o.get("type") != "null"]
        base = options[0] if len(options) == 1 else {"type": "string"}
        ftype = base.get("type", "string")
        widget = {"boolean": "checkbox", "array": "textarea", "integer": "number", "number": "number"}.get(
            ftype, "text"
        )
        if spec.get("widget"):  # declared on the field (a recipe's YAML)
            widget = spec["widget"]
        elif "enum" in base:
            widget = "select"
        elif ftype == "object":
            widget = "pairs"  # KEY=VALUE lines, parsed by the model as the CLI's -k KEY=VALUE
        auto_title = name.replace("_", " ").title()  # pydantic's title when the field declares none
        title = spec.get("title", auto_title)
        label = title if title != auto_title else name.replace("_", " ").capitalize()
        fields.append(
            {
                "name": name,
                "label": label,
                # required fields, the outputs and the kind's essentials first; the rest under Advanced
                "advanced": name not in required
                and name not in kind.params.output_paths
                and name not in kind.params.essentials,
                "widget": widget,
                "type": ftype,
                "options": base.get("enum", []),
                "min": base.get("minimum"),
                "max": base.get("maximum"),
                "description": spec.get("description", ""),
                "default": spec.get("default"),
                "required": name in required,
                "path": name in kind.params.input_paths,
                "output": name in kind.params.output_paths,
            }
        )
    return fields


def default_text(field: Mapping[str, Any]) -> str:
    """A form field's default as the form posts it (a query prefills it so): true/false, one value a
    line, "" for none."""
    value = field["default"]
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


class FormError(UsageError):
    """A form value that cannot even be read (its field and what was typed come back to the user)."""

    def __init__(self, message: str, raw: dict[str, str]):
        super().__init__(message)
        self.raw = raw


def form_params(kind_name: str, form: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """(parameters for the kind, the raw text to show again on an error) from a submitted form."""
    fields = {f["name"]: f for f in form_fields(kind_name)}
    widgets = {name: f["widget"] for name, f in fields.items()}
    raw = {k: str(v) for k, v in form.items() if k not in ("kind", "csrf") and str(v).strip() != ""}
    params: dict[str, Any] = {}
    for name, text in raw.items():
        if name in fields and text.strip() == default_text(fields[name]):
            continue  # the prefilled default: the model's own, left unset (its `model_fields_set`)
        widget = widgets.get(name)
        if widget == "textarea":
            params[name] = [line.strip() for line in text.splitlines() if line.strip()]
        elif widget in ("pairs", "yaml"):
            params[name] = text  # KEY=VALUE lines or YAML: the kind's model parses them, as it does the CLI's
        else:
            params[name] = text.strip()
    return params, raw


def job_context(session: Session, job_id: int) -> dict[str, Any]:
    job = records.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    events = session.exec(
        select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id).desc()).limit(LOG_TAIL)
    ).all()
    outputs = session.exec(
        select(JobOutput).where(JobOutput.job_id == job_id).order_by(col(JobOutput.id))
    ).all()
    issues = [e for e in events if e.code]
    issues.sort(key=lambda e: ({"error": 0, "rejected": 1, "warning": 2}.get(e.level, 3), -e.count))
    datasets = records.datasets_of(session, job_id)
    alerts = session.exec(select(Alert).where(Alert.job_id == job_id).order_by(col(Alert.id))).all()
    # an alert that says the job's error again (empty_output) is folded into the error's notice
    repeats = {f"job {job_id}: {job.error}"} if job.error else set()
    # a run that reported from elsewhere: its result came over the API, checked as it arrives, and shown
    # only if it is one (a row stored before the checks is named, never rendered)
    result, result_problem = shown_result(job.result) if job.external_key else (job.result, None)
    return {
        "job": job,
        "result": result,
        "result_problem": result_problem,
        "alerts": alerts,
        "shown_alerts": [a for a in alerts if a.message not in repeats],
        "next_steps": next_steps(job, outputs, datasets, alerts),
        "log": list(reversed(events)),
        "issues": issues,
        "outputs": outputs,
        "datasets": datasets,
        "terminal": job.status in ("succeeded", "failed", "cancelled"),
        "no_worker": job.status in ("queued", "running")
        and not liveness.of_job(session, job, get_settings().lost_after_seconds).served,
    }
