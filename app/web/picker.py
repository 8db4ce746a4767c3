"""The New-job form's helpers (htmx partials): a file picker over the data roots, the absolute path a
typed path will mean (the one rule of draftdeck/paths.py), shown under each path field, and a train
job's memory plan per sharding (draftdeck/drafter/train/plan.py).

Only folders inside the data roots are listed (symlinks resolved, as for every path over HTTP); every
name is escaped by the templates' autoescape.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from app.web.deps import SettingsDep
from app.web.render import render
from draftdeck.browse.files import folder_kind, list_folder
from draftdeck.errors import PathNotAllowedError
from draftdeck.kinds import KINDS
from draftdeck.paths import resolve_in_roots
from draftdeck.units import binary_size

router = APIRouter()
FIELD = re.compile(r"^[a-z][a-z0-9_]{0,39}$")  # a parameter name: safe in element ids


def _field(name: str) -> str:
    if not FIELD.match(name):
        raise HTTPException(400, f"not a parameter name: {name[:40]!r}")
    return name


def _files_url(field: str, folder: Path | None) -> str:
    query = {"field": field} | ({"dir": str(folder)} if folder is not None else {})
    return "/jobs/new/files?" + urlencode(query)


@router.get("/jobs/new/files", response_class=HTMLResponse)
def file_picker(
    request: Request,
    settings: SettingsDep,
    field: Annotated[str, Query()] = "inputs",
    dir: Annotated[str | None, Query()] = None,
) -> HTMLResponse:
    """A folder's folders and files (size, detected kind); without `dir`, the data roots."""
    name = _field(field)
    roots = settings.roots
    context: dict[str, Any] = {"field": name, "folder": None, "up": None, "entries": [], "left_out": 0,
                               "error": None}  # fmt: skip
    if not dir:
        context["entries"] = [
            {"name": str(r), "path": str(r), "is_dir": True,
             "kind": folder_kind(r) if r.is_dir() else "missing", "size": None, "open": _files_url(name, r)}
            for r in roots
        ]  # fmt: skip
        return render(request, "partials/file_picker.html", **context)
    try:
        folder = resolve_in_roots(dir, roots)
        if not folder.is_dir():
            raise PathNotAllowedError(f"{dir}: not a folder")
        listing = list_folder(folder)
    except (PathNotAllowedError, OSError) as exc:
        context["error"] = str(exc)
        return render(request, "partials/file_picker.html", status_code=400, **context)
    at_root = folder in roots
    context.update(
        folder=str(folder),
        up=_files_url(name, None if at_root else folder.parent),
        left_out=listing.left_out,
        entries=[
            {"name": e.name, "path": str(e.path), "is_dir": e.is_dir, "kind": e.kind,
             "size": binary_size(e.size) if e.size is not None else None,
             "open": _files_url(name, e.path) if e.is_dir else None}
            for e in listing.entries
        ],
    )  # fmt: skip
    return render(request, "partials/file_picker.html", **context)


@router.get("/jobs/new/resolve", response_class=HTMLResponse)
def resolve_preview(request: Request, settings: SettingsDep, kind: str, field: str) -> HTMLResponse:
    """Where each path typed in `field` (the request's parameter of that name; one a line) will
    point: the absolute path the job will get, or why it is refused."""
    name = _field(field)
    job_kind = KINDS.get(kind)
    if job_kind is None:
        raise HTTPException(404, f"unknown job kind {kind!r}")
    must_exist = name not in job_kind.params.output_paths
    lines = [x.strip() for x in str(request.query_params.get(name, "")).splitlines() if x.strip()]
    resolved: list[dict[str, str | None]] = []
    for line in lines[:50]:  # the preview of a long list: its first 50 lines
        try:
            resolved.append({"path": str(resolve_in_roots(line, settings.roots, must_exist=must_exist)),
                             "error": None})  # fmt: skip
        except PathNotAllowedError as exc:
            resolved.append({"path": None, "error": str(exc)})
    return render(request, "partials/path_preview.html", resolved=resolved)


PLAN_FIELDS = ("drafter", "layers", "block_size", "ttt_steps", "draft_vocab_size", "seq_length", "batch_size",
               "eval_batch_size", "anchors_per_seq", "anchors_per_forward", "gradient_checkpointing", "loss",
               "devices")  # fmt: skip
PLAN_SEQ_LENGTH = 4096  # the rows' length the panel plans for when seq_length is unset


@router.get("/jobs/new/plan", response_class=HTMLResponse)
def train_plan(request: Request, settings: SettingsDep) -> HTMLResponse:
    """A train job's per-rank memory for each sharding (draftdeck.drafter.train.plan), from the form's
    target and shape as typed; on this server's GPU when it has one (fits or not), else the terms alone."""
    from pydantic import ValidationError

    from draftdeck.drafter.train.device import capacity_bytes
    from draftdeck.drafter.train.params import PlanParams
    from draftdeck.drafter.train.plan import describe, plan, shape_of, target_config
    from draftdeck.errors import DraftDeckError

    form = request.query_params
    target = (form.get("target") or "").strip()
    if not target:
        return render(request, "partials/train_plan.html", error="give the target to see what the run needs")
    typed = {k: form.get(k) for k in PLAN_FIELDS if form.get(k) not in (None, "")}
    typed["gradient_checkpointing"] = str(form.get("gradient_checkpointing") in ("true", "on"))
    cache = (form.get("hidden_states") or form.get("hidden_states_cache") or "").strip()
    typed["hidden_states"] = str(bool(cache))  # a run from a cache
    try:
        folder = resolve_in_roots(target, settings.roots, must_exist=True)
        typed["seq_length"] = typed.get("seq_length") or str(PLAN_SEQ_LENGTH)
        params = PlanParams.model_validate({"target": str(folder), **typed})
        gpu = form.get("device") != "cpu" and _has_gpu()
        capacity = capacity_bytes(_cuda()) if gpu else None
        world = int(typed.get("devices") or 1)
        shape = shape_of(params, seq_length=params.seq_length, element_size=2 if gpu else 4, world=world)
        result = plan(target_config(folder), shape, capacity)
    except (PathNotAllowedError, ValidationError, DraftDeckError, ValueError) as exc:
        return render(request, "partials/train_plan.html", error=str(exc).splitlines()[0])
    return render(request, "partials/train_plan.html", plan=result, rows=describe(result), gpu=gpu,
                  seq_length=params.seq_length, seq_given=bool(form.get("seq_length")))  # fmt: skip


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _cuda() -> Any:
    import torch

    return torch.device("cuda", 0)
