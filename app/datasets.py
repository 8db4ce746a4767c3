"""Dataset pages: the list of tokenized datasets, one dataset's facts and alerts, the sample view (token
chips coloured by what the drafter trains on), statistics and comparison.

Everything a user sees is escaped by Jinja's autoescape; sample text is never marked safe. Bad row
numbers and filters give a page that says what is wrong (HTTP 400/404), never a 500.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlmodel import Session, col, select

from app import records as jobs
from app.auth import require_page_write
from app.dataset_view import (
    BrowseError,
    Chip,
    DatasetInfo,
    Filters,
    Step,
    alerts_for,
    cached_info,
    chips_for,
    first_match,
    forget_store,
    load_info,
    open_store,
    position_in,
    random_match,
    stats_payload,
    token_table,
)
from app.deps import SessionDep, SettingsDep
from app.models import Alert, Dataset, JobOutput
from app.pages import render
from app.settings import Settings
from draftdeck.errors import PathNotAllowedError
from draftdeck.paths import resolve_in_roots

router = APIRouter(include_in_schema=False)
WriteDep = Depends(require_page_write)
SOURCE_SCAN_SECONDS = 3.0
CHIP_WINDOW = 4096  # tokens drawn per page; longer rows get links to the next and previous windows
_rng = random.Random()


# -- finding datasets ----------------------------------------------------------------------------------


def _dataset_dir(path: Path) -> Path | None:
    """The dataset directory an output path belongs to (the path itself or its parent), if any."""
    for candidate in (path, path.parent):
        if candidate.is_dir() and (
            (candidate / "manifest.json").exists() or (candidate / "state.json").exists()
        ):
            return candidate
    return None


def sync_job_datasets(session: Session) -> None:
    """Register every dataset directory a job recorded among its outputs (once)."""
    known = set(session.exec(select(Dataset.path)).all())
    seen: set[str] = set()
    for out in session.exec(select(JobOutput).order_by(col(JobOutput.id))).all():
        directory = _dataset_dir(Path(out.path))
        if directory is None:
            continue
        key = str(directory.resolve())
        if key in known or key in seen:
            continue
        seen.add(key)
        ds = Dataset(path=key, name=directory.name, job_id=out.job_id, origin="job")
        session.add(ds)
        session.commit()
        session.refresh(ds)
        sync_alerts(session, ds, load_info(directory))


def sync_alerts(session: Session, ds: Dataset, info: DatasetInfo) -> None:
    """Raise each alert this dataset deserves, once per kind."""
    raised = set(session.exec(select(Alert.kind).where(Alert.dataset == ds.path)).all())
    for kind, message in alerts_for(info):
        if kind not in raised:
            jobs.raise_alert(session, kind, message, job_id=ds.job_id, dataset=ds.path)


def _get(session: Session, dataset_id: int) -> Dataset:
    ds = session.get(Dataset, dataset_id)
    if ds is None:
        raise HTTPException(404, f"no dataset {dataset_id}: it was deleted, or never registered")
    return ds


def _filters(request: Request) -> tuple[Filters, str | None]:
    try:
        return Filters.parse(dict(request.query_params)), None
    except BrowseError as exc:
        return Filters(), str(exc)


def _qs(f: Filters, **extra: Any) -> str:
    params = {**f.query(), **{k: str(v) for k, v in extra.items() if v is not None}}
    return ("?" + urlencode(params)) if params else ""


# -- list, register, overview, delete ------------------------------------------------------------------


@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    error: str | None = None,
    path_value: str = "",
) -> HTMLResponse:
    sync_job_datasets(session)
    rows = session.exec(select(Dataset).order_by(col(Dataset.id).desc())).all()
    items = [(ds, load_info(Path(ds.path))) for ds in rows]
    open_by_path: dict[str, int] = {}
    for alert in session.exec(select(Alert).where(Alert.acknowledged == False, Alert.dataset != None)).all():  # noqa: E711,E712
        open_by_path[alert.dataset or ""] = open_by_path.get(alert.dataset or "", 0) + 1
    return render(
        request,
        "datasets.html",
        session,
        nav="datasets",
        items=items,
        open_by_path=open_by_path,
        roots=settings.roots,
        error=error,
        path_value=path_value,
        status_code=400 if error else 200,
    )


@router.post("/datasets", dependencies=[WriteDep])
def register_dataset(
    request: Request, session: SessionDep, settings: SettingsDep, path: Annotated[str, Form()]
) -> Response:
    try:
        resolved = resolve_in_roots(path.strip(), settings.roots)
        if not resolved.is_dir():
            raise BrowseError(f"{path}: not a directory; register the folder that holds the shards")
        open_store(resolved)
    except (PathNotAllowedError, BrowseError) as exc:
        return datasets_page(request, session, settings, error=str(exc), path_value=path)
    existing = session.exec(select(Dataset).where(Dataset.path == str(resolved))).first()
    if existing is not None:
        return RedirectResponse(f"/datasets/{existing.id}", status_code=303)
    ds = Dataset(path=str(resolved), name=resolved.name, origin="registered")
    session.add(ds)
    session.commit()
    session.refresh(ds)
    sync_alerts(session, ds, load_info(resolved))
    return RedirectResponse(f"/datasets/{ds.id}", status_code=303)


def _row_diff(sides: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How the same row differs between two datasets: token ids and loss masks, position by position."""
    if len(sides) != 2 or not sides[0]["sample"] or not sides[1]["sample"]:
        return None
    a, b = sides[0]["sample"]["chips"], sides[1]["sample"]["chips"]
    first_id = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x.id != y.id), None)
    if first_id is None and len(a) != len(b):
        first_id = min(len(a), len(b))
    mask_diff = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x.id == y.id and x.mask != y.mask]
    for side in sides:
        for i in mask_diff:
            side["sample"]["chips"][i].diff = True
    return {
        "same_ids": first_id is None,
        "first_id": first_id,
        "mask_diff": len(mask_diff),
        "first_mask": mask_diff[0] if mask_diff else None,
        "len_a": len(a),
        "len_b": len(b),
    }


def _dataset_alerts(session: Session, ds: Dataset) -> list[Alert]:
    return list(
        session.exec(
            select(Alert)
            .where(Alert.dataset == ds.path)
            .order_by(col(Alert.acknowledged), col(Alert.id).desc())
        ).all()
    )


@router.get("/datasets/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, session: SessionDep, a: int | None = None, b: int | None = None, row: str | None = None
) -> HTMLResponse:
    everything = session.exec(select(Dataset).order_by(col(Dataset.id).desc())).all()
    sides: list[dict[str, Any]] = []
    error = None
    row_n: int | None = None
    if row not in (None, ""):
        try:
            row_n = int(str(row))
            if row_n < 0:
                raise ValueError
        except ValueError:
            error = f"row must be a whole number of 0 or more, not {row!r}"
    for dataset_id in (a, b):
        if dataset_id is None:
            continue
        ds = session.get(Dataset, dataset_id)
        if ds is None:
            error = f"no dataset {dataset_id}"
            continue
        info = load_info(Path(ds.path))
        side: dict[str, Any] = {"ds": ds, "info": info, "sample": None, "message": None}
        if row_n is not None and error is None:
            try:
                side["sample"] = _sample(ds, info, row_n)
            except BrowseError as exc:
                side["message"] = str(exc)
        sides.append(side)
    diff = _row_diff(sides) if row_n is not None else None
    return render(
        request,
        "datasets_compare.html",
        session,
        nav="datasets",
        datasets=everything,
        sides=sides,
        a=a,
        b=b,
        row=row if row is not None else "",
        error=error,
        diff=diff,
        status_code=400 if error else 200,
    )


@router.get("/datasets/{dataset_id}", response_class=HTMLResponse)
def dataset_page(request: Request, dataset_id: int, session: SessionDep) -> HTMLResponse:
    ds = _get(session, dataset_id)
    info = load_info(Path(ds.path))
    sync_alerts(session, ds, info)
    return render(
        request,
        "datasets_detail.html",
        session,
        nav="datasets",
        ds=ds,
        info=info,
        alerts=_dataset_alerts(session, ds),
    )


@router.post("/datasets/{dataset_id}/alerts/{alert_id}/ack", dependencies=[WriteDep])
def ack_dataset_alert(dataset_id: int, alert_id: int, session: SessionDep) -> RedirectResponse:
    ds = _get(session, dataset_id)
    alert = session.get(Alert, alert_id)
    if alert is None or alert.dataset != ds.path:
        raise HTTPException(404, f"no alert {alert_id} on dataset {dataset_id}")
    jobs.acknowledge_alert(session, alert_id)
    return RedirectResponse(f"/datasets/{dataset_id}", status_code=303)


def _deletable(ds: Dataset, settings: Settings) -> tuple[bool, str]:
    """Whether the files may be deleted: only a directory strictly inside a data root."""
    try:
        resolved = resolve_in_roots(ds.path, settings.roots)
    except PathNotAllowedError as exc:
        return False, str(exc)
    roots = [Path(r).resolve() for r in settings.roots]
    if any(root == resolved or root.is_relative_to(resolved) for root in roots):
        return False, f"{resolved} is (or holds) a data root; it is never deleted"
    if not resolved.is_dir():
        return False, f"{resolved} is no longer on disk"
    if not ((resolved / "manifest.json").exists() or (resolved / "state.json").exists()):
        return False, f"{resolved} no longer looks like a dataset folder (no manifest.json or state.json)"
    return True, str(resolved)


@router.get("/datasets/{dataset_id}/delete", response_class=HTMLResponse)
def delete_confirm_page(
    request: Request, dataset_id: int, session: SessionDep, settings: SettingsDep
) -> HTMLResponse:
    return _delete_page(request, session, settings, _get(session, dataset_id))


def _delete_page(
    request: Request, session: Session, settings: Settings, ds: Dataset, error: str | None = None
) -> HTMLResponse:
    """The confirmation page; with `error`, shown again as a 400 saying why nothing was deleted."""
    can_delete_files, why = _deletable(ds, settings)
    return render(request, "datasets_delete.html", session, nav="datasets", ds=ds,
                  can_delete_files=can_delete_files, why=why, error=error,
                  status_code=400 if error else 200)  # fmt: skip


@router.post("/datasets/{dataset_id}/delete", dependencies=[WriteDep])
def delete_dataset(
    request: Request,
    dataset_id: int,
    session: SessionDep,
    settings: SettingsDep,
    confirm: Annotated[str, Form()] = "",
    files: Annotated[str, Form()] = "",
) -> Response:
    ds = _get(session, dataset_id)
    if confirm != ds.name:
        return _delete_page(request, session, settings, ds, f"type the dataset's name ({ds.name}) to confirm")
    if files:
        ok, why = _deletable(ds, settings)
        if not ok:
            return _delete_page(request, session, settings, ds, f"the files were not deleted: {why}")
        forget_store(Path(why))
        shutil.rmtree(why)
    session.delete(ds)
    session.commit()
    return RedirectResponse("/datasets", status_code=303)


# -- sample view ---------------------------------------------------------------------------------------


def _tokenizer_dir(ds: Dataset, info: DatasetInfo) -> str | None:
    if not info.tokenizer_path:
        return None
    path = Path(info.tokenizer_path).expanduser()
    if not path.is_absolute():
        path = Path(ds.path) / path
    return str(path.resolve()) if path.is_dir() else None


def _sample(ds: Dataset, info: DatasetInfo, n: int, window_from: int = 0) -> dict[str, Any]:
    """Row n's facts (over the whole row) and its chips; at most CHIP_WINDOW chips are drawn, from
    `window_from`, so a 32K-token row costs no more to draw than a 4K one."""
    store = open_store(Path(ds.path))
    row = store.row(n)
    ids = [int(t) for t in row["input_ids"]]
    mask = [int(m) for m in row["loss_mask"]]
    tok_dir = _tokenizer_dir(ds, info)
    notice = None
    if tok_dir is not None:
        chips = chips_for(ids, mask, token_table(tok_dir))
    else:
        notice = (
            f"the tokenizer {info.tokenizer_path!r} is not on this machine: showing token ids"
            if info.tokenizer_path
            else "the manifest names no tokenizer: showing token ids"
        )
        chips = [
            Chip(pos=i, id=t, mask=mask[i] if i < len(mask) else 0, text=str(t), raw=str(t))
            for i, t in enumerate(ids)
        ]
        for i, c in enumerate(chips):
            c.edge = i > 0 and c.mask != chips[i - 1].mask
            c.anchor = bool(c.mask) and i + 1 < len(chips) and bool(chips[i + 1].mask)
    w0 = min(max(window_from, 0), max(len(chips) - 1, 0))
    w0 -= w0 % CHIP_WINDOW
    w1 = min(w0 + CHIP_WINDOW, len(chips))
    return {
        "n": n,
        "total": len(store),
        "chips": chips[w0:w1] if (w0, w1) != (0, len(chips)) else chips,
        "window": (w0, w1) if (w0, w1) != (0, len(chips)) else None,
        "window_prev": max(w0 - CHIP_WINDOW, 0) if w0 > 0 else None,
        "window_next": w1 if w1 < len(chips) else None,
        "n_tokens": len(ids),
        "n_trained": sum(1 for m in mask if m),
        "n_anchors": sum(1 for c in chips if c.anchor),
        "length_mismatch": len(ids) != len(mask),
        "stored_n_trained": row.get("n_trained"),
        "truncated": row.get("truncated"),
        "source": row.get("source"),
        "source_row": row.get("source_row"),
        "turn": row.get("turn"),
        "notice": notice,
    }


def _sources(info: DatasetInfo) -> list[str]:
    return [s["source"] for s in stats_payload(info)["per_source"]][:500]


def _sample_response(
    request: Request,
    session: Session,
    ds: Dataset,
    n: int,
    f: Filters,
    *,
    message: str | None = None,
    step: Step | None = None,
    partial: bool,
    filter_error: str | None = None,
    push: bool = False,
    window_from: int = 0,
) -> HTMLResponse:
    started = time.perf_counter()
    info = cached_info(Path(ds.path))
    context: dict[str, Any] = {
        "ds": ds,
        "info": info,
        "f": f,
        "fq": f.query(),
        "qs": _qs(f),
        "message": message or filter_error,
        "sources": _sources(info),
        "resume": step.resume_at if step else None,
        "sample": None,
    }
    base = f"/datasets/{ds.id}/go"
    context["urls"] = {
        "prev": base + _qs(f, to="prev", at=n),
        "next": base + _qs(f, to="next", at=n),
        "random": base + _qs(f, to="random", at=n),
        "resume": base + _qs(f, to="resume", at=step.resume_at)
        if step and step.resume_at is not None
        else None,
    }
    status = 400 if filter_error else 200
    try:
        context["sample"] = _sample(ds, info, n, window_from)
        pos, count = position_in(open_store(Path(ds.path)), f, n)
        context.update(position=pos, matching=count)
    except BrowseError as exc:
        context["message"] = context["message"] or str(exc)
        if not filter_error:
            status = 404 if info.readable else 409
    if partial:
        # htmx swaps only 2xx answers: a message about the request is still the answer to show.
        status = 200
    name = "partials/dataset_sample.html" if partial else "datasets_sample.html"
    response = render(
        request, name, None if partial else session, nav="datasets", status_code=status, **context
    )
    if push and context["sample"] is not None:
        response.headers["HX-Push-Url"] = f"/datasets/{ds.id}/rows/{n}{_qs(f)}"
    response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.2f}"
    return response


def _is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true" and request.headers.get("hx-boosted") != "true"


@router.get("/datasets/{dataset_id}/rows/{n}", response_class=HTMLResponse)
def sample_page(
    request: Request, dataset_id: int, n: int, session: SessionDep, tokens: str = "0"
) -> HTMLResponse:
    ds = _get(session, dataset_id)
    f, error = _filters(request)
    window = int(tokens) if tokens.isdigit() else 0
    return _sample_response(
        request, session, ds, n, f, partial=_is_htmx(request), filter_error=error, window_from=window
    )


@router.get("/datasets/{dataset_id}/go", response_class=HTMLResponse)
def go(
    request: Request, dataset_id: int, session: SessionDep, to: str = "next", at: str | None = None
) -> Response:
    """Navigation: to = next | prev | random | first | row (with at=N) | resume (continue a search at=N)."""
    ds = _get(session, dataset_id)
    f, error = _filters(request)
    htmx = _is_htmx(request)
    current = 0
    if at not in (None, ""):
        try:
            current = int(str(at))
        except ValueError:
            return _sample_response(
                request,
                session,
                ds,
                0,
                f,
                partial=htmx,
                filter_error=f"row must be a whole number, not {at!r}",
            )
    if error:
        return _sample_response(request, session, ds, current, f, partial=htmx, filter_error=error)
    info = cached_info(Path(ds.path))
    try:
        store = open_store(Path(ds.path))
        tok_dir = _tokenizer_dir(ds, info)
        table = token_table(tok_dir) if (tok_dir and f.q) else None
        if to == "row":
            if not 0 <= current < len(store):
                raise BrowseError(
                    f"row {current} is out of range: this dataset has rows 0 to {len(store) - 1}"
                    if len(store)
                    else "this dataset has no rows"
                )
            step = Step(current)
        elif to == "next":
            step = first_match(store, table, f, current + 1, 1)
        elif to == "prev":
            step = (
                first_match(store, table, f, current - 1, -1)
                if current > 0
                else Step(None, "this is the first row")
            )
        elif to == "random":
            step = random_match(store, table, f, _rng)
        elif to in ("first", "resume"):
            step = first_match(store, table, f, current if to == "resume" else 0, 1)
        else:
            raise BrowseError(f"unknown navigation {to!r}: use next, prev, random, first or row")
    except BrowseError as exc:
        return _sample_response(request, session, ds, current, f, partial=htmx, filter_error=str(exc))
    if step.row is None:
        # Stay on the current row and say why: nothing matched, or the search budget ran out.
        return _sample_response(
            request, session, ds, current, f, partial=htmx, message=step.message, step=step
        )
    if not htmx:
        return RedirectResponse(f"/datasets/{dataset_id}/rows/{step.row}{_qs(f)}", status_code=303)
    return _sample_response(request, session, ds, step.row, f, partial=True, push=True)


def _conversation(value: Any) -> list[dict[str, str]] | None:
    """Role/content pairs from common chat shapes, for display; None when the shape is not a chat."""
    if not isinstance(value, dict):
        return None
    for key, role_key, text_key in (
        ("messages", "role", "content"),
        ("conversations", "from", "value"),
        ("conversations", "role", "content"),
    ):
        msgs = value.get(key)
        if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and role_key in m for m in msgs):
            out = []
            for m in msgs:
                content = m.get(text_key)
                if isinstance(content, list):
                    content = "\n".join(
                        str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content
                    )
                parts = [str(content) if content is not None else ""]
                for extra in ("reasoning_content", "reasoning", "tool_calls"):
                    if m.get(extra):
                        parts.append(
                            f"[{extra}] "
                            + (m[extra] if isinstance(m[extra], str) else orjson.dumps(m[extra]).decode())
                        )
                out.append({"role": str(m.get(role_key)), "text": "\n".join(p for p in parts if p)})
            return out
    return None


@router.get("/datasets/{dataset_id}/rows/{n}/source", response_class=HTMLResponse)
def source_partial(
    request: Request, dataset_id: int, n: int, session: SessionDep, settings: SettingsDep
) -> HTMLResponse:
    """The source conversation of row n, read from its source file when that lies inside the data roots."""
    from draftdeck.formats.readers import RowReader

    ds = _get(session, dataset_id)
    context: dict[str, Any] = {"message": None, "messages": None, "raw": None, "where": None}
    try:
        row = open_store(Path(ds.path)).row(n)
    except BrowseError as exc:
        return render(
            request, "partials/dataset_source.html", message=str(exc), messages=None, raw=None, where=None
        )
    source, index = row.get("source"), row.get("source_row")
    if not source or index is None:
        context["message"] = "this dataset does not record the source file and row"
        return render(request, "partials/dataset_source.html", **context)
    try:
        path = resolve_in_roots(str(source), settings.roots)
    except PathNotAllowedError as exc:
        context["message"] = f"the source file is not readable here: {exc}"
        return render(request, "partials/dataset_source.html", **context)
    deadline = time.monotonic() + SOURCE_SCAN_SECONDS
    found = None
    try:
        with RowReader(path) as reader:
            for raw in reader:
                # the tokenizer records the 1-based line for JSONL, else the 0-based record index
                if (raw.line if raw.line is not None else raw.index) == int(index):
                    found = raw
                    break
                if time.monotonic() > deadline:
                    context["message"] = (
                        f"row {index} of {path.name} is too far into the file to fetch quickly"
                    )
                    break
    except Exception as exc:
        context["message"] = f"{path.name} cannot be read: {exc}"
    if found is not None:
        context["where"] = found.where
        if found.error:
            context["message"] = f"{found.where}: {found.reason}"
        else:
            context["messages"] = _conversation(found.value)
            if context["messages"] is None:
                context["raw"] = orjson.dumps(found.value, option=orjson.OPT_INDENT_2).decode()
    elif context["message"] is None:
        context["message"] = f"{path.name} has no line or record {index}"
    return render(request, "partials/dataset_source.html", **context)


# -- statistics ----------------------------------------------------------------------------------------


@router.get("/datasets/{dataset_id}/stats", response_class=HTMLResponse)
def stats_page(request: Request, dataset_id: int, session: SessionDep) -> HTMLResponse:
    ds = _get(session, dataset_id)
    info = load_info(Path(ds.path))
    return render(
        request, "datasets_stats.html", session, nav="datasets", ds=ds, info=info, stats=stats_payload(info)
    )


@router.get("/datasets/{dataset_id}/stats.json")
def stats_json(dataset_id: int, session: SessionDep) -> JSONResponse:
    ds = _get(session, dataset_id)
    return JSONResponse(stats_payload(load_info(Path(ds.path))))
