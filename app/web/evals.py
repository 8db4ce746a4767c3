"""The leaderboard (/evals): every eval of every run, filterable by target, drafter kind, suite,
thinking mode and offline or served, sorted by any column, and the same table as CSV (/evals.csv).
The rows are read by app/store/leaderboard.py."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.store.leaderboard import FILTERS, cell_columns, choices, eval_rows, select_rows, sort_rows, to_csv
from app.web.deps import SessionDep
from app.web.render import render
from app.web.sweeps import run_sweeps

router = APIRouter(include_in_schema=False)


def _picked(request: Request) -> dict[str, str]:
    return {name: request.query_params.get(name, "") for name in FILTERS}


@router.get("/evals", response_class=HTMLResponse)
def evals_page(request: Request, session: SessionDep, sort: str = "job", order: str = "desc") -> HTMLResponse:
    everything = eval_rows(session)
    picked = _picked(request)
    rows = select_rows(everything, picked)
    cells = cell_columns(rows, picked["suite"])
    # newest first by default (the rows' order); any other column through sort_rows
    rows = (
        sort_rows(rows, sort, order != "asc") if sort != "job" else (rows if order != "asc" else rows[::-1])
    )
    query = {k: v for k, v in picked.items() if v}
    return render(request, "evals.html", session, nav="evals", rows=rows, cells=cells, picked=picked,
                  options=choices(everything), sort=sort, order=order, query=query,
                  total=len(everything), sweeps=run_sweeps(session))  # fmt: skip


@router.get("/evals.csv")
def evals_csv(request: Request, session: SessionDep) -> Response:
    picked = _picked(request)
    rows = select_rows(eval_rows(session), picked)
    body = to_csv(rows, cell_columns(rows, picked["suite"]))
    return Response(body, media_type="text/csv",
                    headers={"Content-Disposition": 'attachment; filename="evals.csv"'})  # fmt: skip
