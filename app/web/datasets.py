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

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlmodel import Session, col, select

from app.settings import Settings, get_settings
from app.store import records as jobs
from app.store.dataset_records import add_datasets, found_at, unregistered_in
from app.store.models import Alert, Dataset
from app.web.auth import require_page_write
from app.web.dataset_views import compared_row, concerns_dataset, dataset_alerts, deletable
from app.web.deps import SessionDep, SettingsDep
from app.web.job_views import new_job_link
from app.web.render import render
from draftdeck.browse.errors import BrowseError
from draftdeck.browse.filters import Filters, Step, navigate, position_in
from draftdeck.browse.info import (
    cached_info,
    forget_dataset,
    load_info,
    mix_sources_of,
    sources_of,
    stats_payload,
)
from draftdeck.browse.loading import open_store, token_table
from draftdeck.browse.sample import RowKey, Sample, read_sample, row_diff, row_key
from draftdeck.browse.source import find_source_row, row_image, source_where
from draftdeck.errors import InputError, PathNotAllowedError
from draftdeck.formats.common import RowRejected
from draftdeck.formats.images import BROWSER_EXTENSIONS, IMAGES_DIR, is_stored_name
from draftdeck.formats.images import check as check_image
from draftdeck.formats.model import ImageRef
from draftdeck.paths import resolve_in_roots

router = APIRouter(include_in_schema=False)
WriteDep = Depends(require_page_write)
_rng = random.Random()


def _get(session: Session, dataset_id: int) -> Dataset:
    """The dataset row; the transaction ends here, so no pooled connection waits on the slow work that
    follows (reading shards, loading a tokenizer). The session opens a new one if asked again."""
    ds = session.get(Dataset, dataset_id)
    session.commit()
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
    """The datasets table as it is: rows come from registration (POST) and from succeeded jobs."""
    rows = session.exec(select(Dataset).order_by(col(Dataset.id).desc())).all()
    open_alerts = session.exec(select(Alert).where(Alert.acknowledged == False)).all()  # noqa: E712
    open_by_id = {ds.id: sum(1 for a in open_alerts if concerns_dataset(a, ds)) for ds in rows}
    session.commit()
    items = [(ds, load_info(Path(ds.path))) for ds in rows]
    unregistered = unregistered_in(settings.roots, [ds.path for ds in rows])
    return render(request, "datasets.html", session, nav="datasets", items=items, open_by_id=open_by_id,
                  roots=settings.roots, error=error, path_value=path_value, unregistered=unregistered,
                  status_code=400 if error else 200)  # fmt: skip


@router.post("/datasets", dependencies=[WriteDep])
def register_dataset(
    request: Request, session: SessionDep, settings: SettingsDep, path: Annotated[str, Form()]
) -> Response:
    try:
        resolved = resolve_in_roots(path.strip(), settings.roots)
        if not resolved.is_dir():
            raise BrowseError(f"{path}: not a directory; register the folder that holds the shards")
        open_store(resolved)
        found = found_at(resolved)
    except (PathNotAllowedError, InputError) as exc:
        return datasets_page(request, session, settings, error=str(exc), path_value=path)
    [ds] = add_datasets(session, [found], job_id=None)
    session.commit()
    return RedirectResponse(f"/datasets/{ds.id}", status_code=303)


def _row_number(row: str | None) -> tuple[int | None, str | None]:
    if row in (None, ""):
        return None, None
    try:
        n = int(str(row))
    except ValueError:
        n = -1
    return (n, None) if n >= 0 else (None, f"row must be a whole number of 0 or more, not {row!r}")


@router.get("/datasets/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, session: SessionDep, a: int | None = None, b: int | None = None, row: str | None = None
) -> HTMLResponse:
    everything = session.exec(select(Dataset).order_by(col(Dataset.id).desc())).all()
    chosen = [(i, session.get(Dataset, i)) for i in (a, b) if i is not None]
    session.commit()
    row_n, error = _row_number(row)
    sides: list[dict[str, Any]] = []
    key: RowKey | None = None  # the first side's row, as (source, source row, turn)
    for dataset_id, ds in chosen:
        if ds is None:
            error = f"no dataset {dataset_id}"
            continue
        info = load_info(Path(ds.path))
        side: dict[str, Any] = {"ds": ds, "info": info, "sample": None, "message": None, "matched": None}
        if row_n is not None and error is None and sides and sides[0]["sample"] is None:
            side["message"] = f"nothing to pair with: row {row_n} of the first dataset could not be read"
        elif row_n is not None and error is None:
            try:
                side.update(compared_row(info, row_n, key, first=not sides, roots=get_settings().roots))
                if not sides and side["sample"] is not None:
                    key = row_key(side["sample"])
            except InputError as exc:
                side["message"] = str(exc)
        sides.append(side)
    pair = [s["sample"] for s in sides if s["sample"] is not None]
    diff = row_diff(pair[0], pair[1]) if len(pair) == 2 and len(sides) == 2 else None
    return render(request, "datasets_compare.html", session, nav="datasets", datasets=everything, sides=sides,
                  a=a, b=b, row=row if row is not None else "", error=error, diff=diff,
                  status_code=400 if error else 200)  # fmt: skip


@router.get("/datasets/{dataset_id}", response_class=HTMLResponse)
def dataset_page(request: Request, dataset_id: int, session: SessionDep) -> HTMLResponse:
    ds = _get(session, dataset_id)
    alerts = dataset_alerts(session, ds)
    session.commit()
    info = load_info(Path(ds.path))
    # the next step: a training run on it, against the model its tokenizer came from when that is one
    tokenizer = info.tokenizer_dir(get_settings().roots) if info.readable else None
    target = tokenizer if tokenizer and (Path(tokenizer) / "config.json").is_file() else None
    train_link = new_job_link("train", {"inputs": [ds.path], "target": target})
    return render(request, "datasets_detail.html", session, nav="datasets", ds=ds, info=info, alerts=alerts,
                  mix_sources=mix_sources_of(info), train_link=train_link)  # fmt: skip


@router.post("/datasets/{dataset_id}/alerts/{alert_id}/ack", dependencies=[WriteDep])
def ack_dataset_alert(dataset_id: int, alert_id: int, session: SessionDep) -> RedirectResponse:
    ds = _get(session, dataset_id)
    alert = session.get(Alert, alert_id)
    if alert is None or not concerns_dataset(alert, ds):
        raise HTTPException(404, f"no alert {alert_id} on dataset {dataset_id}")
    jobs.acknowledge_alert(session, alert_id)
    return RedirectResponse(f"/datasets/{dataset_id}", status_code=303)


@router.get("/datasets/{dataset_id}/delete", response_class=HTMLResponse)
def delete_confirm_page(
    request: Request, dataset_id: int, session: SessionDep, settings: SettingsDep
) -> HTMLResponse:
    return _delete_page(request, session, settings, _get(session, dataset_id))


def _delete_page(
    request: Request, session: Session, settings: Settings, ds: Dataset, error: str | None = None
) -> HTMLResponse:
    """The confirmation page; with `error`, shown again as a 400 saying why nothing was deleted."""
    can_delete_files, why = deletable(ds, settings)
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
        ok, why = deletable(ds, settings)
        if not ok:
            return _delete_page(request, session, settings, ds, f"the files were not deleted: {why}")
        forget_dataset(Path(why))
        shutil.rmtree(why)
    session.delete(ds)
    session.commit()
    return RedirectResponse("/datasets", status_code=303)


# -- sample view ---------------------------------------------------------------------------------------


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
    base = f"/datasets/{ds.id}/go"
    resume = step.resume_at if step else None
    urls = {
        "prev": base + _qs(f, to="prev", at=n),
        "next": base + _qs(f, to="next", at=n),
        "random": base + _qs(f, to="random", at=n),
        "resume": base + _qs(f, to="resume", at=resume) if resume is not None else None,
    }
    context: dict[str, Any] = {"ds": ds, "info": info, "f": f, "fq": f.query(), "qs": _qs(f),
                               "urls": urls, "message": message or filter_error, "sources": sources_of(info),
                               "resume": resume, "sample": None}  # fmt: skip
    status = 400 if filter_error else 200
    sample: Sample | None = None
    try:
        sample = context["sample"] = read_sample(info, n, window_from, roots=get_settings().roots)
        pos, count = position_in(open_store(Path(ds.path)), f, n)
        context.update(position=pos, matching=count)
    except InputError as exc:
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
    if push and sample is not None:
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
            error = f"row must be a whole number, not {at!r}"
    if error:
        return _sample_response(request, session, ds, current, f, partial=htmx, filter_error=error)
    try:
        info = cached_info(Path(ds.path))
        tok_dir = info.tokenizer_dir(get_settings().roots)
        table = token_table(tok_dir) if (tok_dir and f.q) else None
        step = navigate(open_store(Path(ds.path)), table, f, to, current, _rng)
    except InputError as exc:
        return _sample_response(request, session, ds, current, f, partial=htmx, filter_error=str(exc))
    if step.row is None:
        # Stay on the current row and say why: nothing matched, or the search budget ran out.
        return _sample_response(
            request, session, ds, current, f, partial=htmx, message=step.message, step=step
        )
    if not htmx:
        return RedirectResponse(f"/datasets/{dataset_id}/rows/{step.row}{_qs(f)}", status_code=303)
    return _sample_response(request, session, ds, step.row, f, partial=True, push=True)


@router.get("/datasets/{dataset_id}/rows/{n}/source", response_class=HTMLResponse)
def source_partial(
    request: Request, dataset_id: int, n: int, session: SessionDep, settings: SettingsDep
) -> HTMLResponse:
    """The source conversation of row n, read from its source file when that lies inside the data roots."""
    ds = _get(session, dataset_id)
    nothing: dict[str, Any] = {"messages": None, "raw": None, "where": None}
    try:
        row = open_store(Path(ds.path)).row(n)
    except InputError as exc:
        return render(request, "partials/dataset_source.html", message=str(exc), **nothing)
    source, index = row.get("source"), row.get("source_row")
    if not source or index is None:
        return render(request, "partials/dataset_source.html",
                      message="this dataset does not record the source file and row", **nothing)  # fmt: skip
    try:
        path = resolve_in_roots(str(source), settings.roots)
    except PathNotAllowedError as exc:
        return render(request, "partials/dataset_source.html",
                      message=f"the source file is not readable here: {exc}", **nothing)  # fmt: skip
    found = find_source_row(path, int(index), roots=settings.roots)
    where = source_where(path, int(index)) if found.where else None  # the facts' notation, by file name
    return render(request, "partials/dataset_source.html", message=found.message, messages=found.messages,
                  raw=found.raw, where=where, source=str(path),
                  image_base=f"/datasets/{dataset_id}/rows/{n}/source/images/")  # fmt: skip


@router.get("/datasets/{dataset_id}/rows/{n}/source/images/{k}")
def source_image(dataset_id: int, n: int, k: int, session: SessionDep, settings: SettingsDep) -> Response:
    """Image k of row n's source row (as the source panel numbered them): a file that lies in the data
    roots, or the row's inline data. The page names no path: the row is read again here."""
    ds = _get(session, dataset_id)
    try:
        row = open_store(Path(ds.path)).row(n)
        source, index = row.get("source"), row.get("source_row")
        if not source or index is None:
            raise HTTPException(404, "this dataset does not record the source file and row")
        path = resolve_in_roots(str(source), settings.roots)
    except (InputError, PathNotAllowedError) as exc:
        raise HTTPException(404, str(exc)) from None
    found = find_source_row(path, int(index))
    ref = row_image(found.value, str(path.parent), k) if found.value is not None else None
    if ref is None:
        raise HTTPException(404, f"row {n}'s source has no image {k}")
    return _image_response(ref, settings.roots)


@router.get("/datasets/{dataset_id}/images/{name}")
def dataset_image(dataset_id: int, name: str, session: SessionDep) -> Response:
    """A stored image of the dataset's own images/ folder (content-addressed names only)."""
    ds = _get(session, dataset_id)
    if not is_stored_name(name):
        raise HTTPException(404, "not a stored image's name")
    return _image_response(ImageRef(path=str(Path(ds.path) / IMAGES_DIR / name)), None)


def _image_response(ref: ImageRef, roots: list[Path] | None) -> Response:
    """The image's bytes when PIL reads them as a format browsers show; a file outside `roots` (None:
    the caller confined it) is never read."""
    if ref.path is not None and roots is not None:
        try:
            ref = ImageRef(path=str(resolve_in_roots(ref.path, roots)))
        except PathNotAllowedError as exc:
            raise HTTPException(403, str(exc)) from None
    try:
        checked = check_image(ref)
    except RowRejected as exc:
        raise HTTPException(404, exc.reason) from None
    if checked.ext not in BROWSER_EXTENSIONS:
        raise HTTPException(415, f"a {checked.format} image, which browsers do not show")
    return Response(
        checked.data,
        media_type=checked.mime,
        headers={
            "Cache-Control": "private, max-age=300",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'",
        },
    )


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
