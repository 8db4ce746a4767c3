"""The job pages in a real Chromium against a real `draftdeck up`: start, watch, fail, cancel, escape.

Every test also fails (in the `page` fixture) on a dialog, a CSP violation, a script error or a server
traceback while it ran.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.browser.harness import GOOD_ROW, REAL_DATA, Server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

JOB_URL = re.compile(r"/jobs/(\d+)$")


def start_from_form(page: Any, path: str | Path, **fields: str) -> None:
    page.goto("/jobs/new")
    page.fill("#new-job textarea[name=inputs]", str(path))
    for name, value in fields.items():
        field = page.locator(f"#new-job input[name={name}]")
        if not field.is_visible():  # a policy or limit: under Advanced, as a user finds it
            page.click("#advanced > summary")
        field.fill(value)
    page.click("#new-job button[type=submit]")


def job_id_of(page: Any) -> int:
    page.wait_for_url(JOB_URL)
    m = JOB_URL.search(page.url)
    assert m
    return int(m.group(1))


def mark_document(page: Any) -> None:
    """A marker that survives htmx swaps but not a reload: proves an update came without one."""
    page.evaluate("window.__ddNoReload = 'still here'")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__ddNoReload") == "still here", "the page reloaded"


def count(page: Any, name: str) -> Any:
    return page.locator(f'#job-live [data-count="{name}"] .num')


# -- (a) a scan from the form -------------------------------------------------------------------
def test_scan_from_form_shows_rows_keysets_issues_outputs(page: Any, server: Server, data_file: Any) -> None:
    path = data_file(
        [
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
            {"prompt": "write a haiku", "id": 7},
            '{"messages": [broken',
        ]
    )
    start_from_form(page, path)
    job_id = job_id_of(page)
    mark_document(page)

    expect(page.locator("#job-status")).to_have_text("succeeded")
    assert_not_reloaded(page)
    expect(count(page, "in")).to_have_text("4")
    expect(count(page, "out")).to_have_text("2")  # the rows convert would keep: not the bare prompt
    expect(count(page, "rejected")).to_have_text("2")
    figures = page.locator("#job-figures")
    expect(figures.locator('[data-count="would-keep"] .num')).to_have_text("2")
    expect(figures.locator('[data-count="prompt-only"] .num')).to_have_text("1")
    expect(page.locator("#scan-shapes tbody tr")).to_have_text(
        [re.compile("openai\\s*2"), re.compile("prompt\\s*1")]
    )
    would_reject = page.locator("#scan-would-reject tbody tr")
    expect(would_reject).to_have_count(2)
    expect(would_reject.filter(has_text="no_assistant_turn")).to_contain_text(":3 no assistant message")
    expect(would_reject.filter(has_text="json_error")).to_contain_text(":4 invalid JSON")
    keysets = page.locator("#keysets tbody tr")
    expect(keysets).to_have_count(2)
    expect(keysets.nth(0)).to_contain_text("messages")
    expect(keysets.nth(0).locator("td.num")).to_have_text("2")
    expect(keysets.nth(1)).to_contain_text("id, prompt")
    expect(page.locator("#issues tbody.issue")).to_have_count(2)
    issue = page.locator("#issues tbody.issue").filter(has_text="json_error")
    expect(issue.locator("code")).to_have_text("json_error")
    expect(issue.locator(".sev")).to_have_text("rejected")
    expect(issue.locator(".examples li")).to_have_text(re.compile(r"^line 4 invalid JSON"))
    outputs = page.locator("#outputs tbody tr")
    expect(outputs).to_have_count(1)
    expect(outputs).to_contain_text(f"jobs/{job_id}/scan-report.json")
    expect(outputs.locator("td.num").first).to_have_text("\u2013")  # a report: it holds no rows
    # The page shows what the job recorded, and the report file on disk says the same.
    report = json.loads(Path(server.job(job_id)["outputs"][0]["path"]).read_text())
    assert (report["rows_in"], report["rows_out"]) == (4, 2)
    assert report["rejected"] == {"json_error": 1, "no_assistant_turn": 1}
    # Its event stream is closed (or was never opened, if the job ended before the page loaded).
    expect(page.locator("#job-stream")).not_to_have_attribute("data-sse-state", re.compile("open|connect"))


def _expected_scan(path: Path) -> tuple[int, str]:
    """Rows and the most common key set, computed here independently of DraftDeck's reader."""
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix == ".jsonl":
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        data = json.loads(text)
        records = data if isinstance(data, list) else [data]
    keysets = Counter(", ".join(sorted(r)) for r in records)
    return len(records), keysets.most_common(1)[0][0]


@pytest.mark.parametrize("name", ["LLaMA-Factory__training_data.jsonl", "LLaMA-Factory__identity.json"])
def test_scan_of_a_real_file_from_form(page: Any, name: str) -> None:
    path = REAL_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared/datasets/real/ is not beside this checkout")
    rows, top_keys = _expected_scan(path)
    start_from_form(page, path)
    job_id_of(page)
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(count(page, "in")).to_have_text(f"{rows:,}")
    expect(count(page, "out")).to_have_text(f"{rows:,}")
    expect(count(page, "rejected")).to_have_text("0")
    expect(page.locator("#keysets tbody tr").first.locator("code")).to_have_text(top_keys)
    expect(page.locator("#outputs")).to_contain_text("scan-report.json")
    expect(page.locator("#issues")).to_have_count(0)


def test_job_page_goes_live_from_running_to_succeeded(page: Any, server: Server, slow_file: Any) -> None:
    pipe = slow_file()
    start_from_form(page, pipe.path)
    job_id = job_id_of(page)
    mark_document(page)
    pipe.open()
    pipe.write_rows([{"prompt": f"q{i}"} for i in range(3)])
    expect(page.locator("#job-status")).to_have_text("running")
    expect(page.locator("#job-live .status-line")).to_contain_text("B")  # bytes read so far
    pipe.write_rows([json.loads(GOOD_ROW)])  # a row convert keeps: the scan passes
    pipe.close()

    expect(page.locator("#job-status")).to_have_text("succeeded")
    assert_not_reloaded(page)
    expect(count(page, "in")).to_have_text("4")
    expect(page.locator("#job-log")).to_contain_text("succeeded: 4 rows in, 1 out, 3 rejected")  # prompts
    # Terminal: the stream closed, and nothing asks the server again in the next 2.5 s.
    expect(page.locator("#job-stream")).to_have_attribute("data-sse-state", "closed")
    polled: list[str] = []
    page.on("request", lambda r: polled.append(r.url))
    page.wait_for_timeout(2500)
    assert polled == []
    assert server.job(job_id)["status"] == "succeeded"


# -- (b) an empty file fails, with an alert ------------------------------------------------------
def test_empty_file_fails_and_raises_an_alert_that_can_be_acknowledged(
    page: Any, server: Server, data_file: Any
) -> None:
    path = data_file([], name="empty.jsonl")
    before = len(server.open_alerts())
    start_from_form(page, path)
    job_id = job_id_of(page)
    mark_document(page)

    expect(page.locator("#job-status")).to_have_text("failed")
    expect(page.locator("#job-error")).to_contain_text(f"{path}: empty input (0 bytes, no rows)")
    expect(count(page, "in")).to_have_text("0")
    # the same empty file fails the same way: the page offers the form, not Retry
    expect(page.locator("#job-no-retry")).to_be_visible()
    expect(page.locator("#job-live form[action$='/retry'] button")).to_have_count(0)
    expect(page.locator("#next-steps a", has_text="Change and start again")).to_be_visible()
    # The nav badge lit up without a reload (sent out of band with the last live update).
    badge = page.locator("#alert-count")
    expect(badge).to_be_visible()
    expect(badge).to_have_text(str(before + 1))
    assert_not_reloaded(page)

    page.click("header nav a[href='/alerts']")
    alert = page.locator("li.alert.open", has=page.locator(f"a[href='/jobs/{job_id}']"))
    expect(alert).to_have_count(1)
    expect(alert.locator(".alert-kind")).to_have_text("empty output")
    expect(alert.locator(".alert-msg")).to_contain_text(f"job {job_id}: {path}: empty input")
    alert.locator("button", has_text="Acknowledge").click()
    page.wait_for_url("**/alerts")
    acked = page.locator("li.alert.acked", has=page.locator(f"a[href='/jobs/{job_id}']"))
    expect(acked).to_contain_text("acknowledged")
    expect(acked.locator("button")).to_have_count(0)
    assert len(server.open_alerts()) == before
    if before == 0:
        expect(page.locator("#alert-count")).to_be_hidden()
    else:
        expect(page.locator("#alert-count")).to_have_text(str(before))


# -- (c) a path outside the data roots ----------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("/etc/passwd", "/etc/passwd: outside the data roots"),
        ("../../outside.jsonl", "outside the data roots"),
        ("data/missing.jsonl", "data/missing.jsonl: no such file or directory"),
    ],
)
def test_bad_path_gives_a_clear_error_on_the_form(
    page: Any, server: Server, given: str, message: str
) -> None:
    jobs_before = len(server.api("GET", "/api/jobs?limit=500"))
    page.goto("/jobs/new")
    page.fill("#new-job textarea[name=inputs]", given)
    with page.expect_response(lambda r: r.url.endswith("/jobs") and r.request.method == "POST") as resp:
        page.click("#new-job button[type=submit]")
    assert resp.value.status == 400
    assert resp.value.headers["content-type"].startswith("text/html")
    notice = page.locator(".notice-error[role=alert]")
    expect(notice).to_contain_text(message)
    expect(page.locator("h1")).to_have_text("New job")
    expect(page.locator("#new-job textarea[name=inputs]")).to_have_value(given)  # what the user typed stays
    assert len(server.api("GET", "/api/jobs?limit=500")) == jobs_before
    # Nothing crashed: fix the path on the same form and it runs.
    good = server.data_dir / "fixed.jsonl"
    good.write_text(GOOD_ROW + "\n")  # a row convert keeps: the scan passes
    page.fill("#new-job textarea[name=inputs]", str(good))
    page.click("#new-job button[type=submit]")
    job_id_of(page)
    expect(page.locator("#job-status")).to_have_text("succeeded")


def test_invalid_number_parameter_is_refused_with_its_name(page: Any, data_file: Any) -> None:
    path = data_file([{"a": 1}])
    start_from_form(page, path, max_row_bytes="0")
    expect(page.locator(".notice-error")).to_contain_text("max_row_bytes")
    expect(page.locator(".notice-error")).to_contain_text("greater than 0")
    expect(page.locator("#new-job input[name=max_row_bytes]")).to_have_value("0")


# -- (d) hostile text is shown as text ---------------------------------------------------------
SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"


def test_hostile_keys_values_and_file_names_are_shown_as_text(
    page: Any, server: Server, data_file: Any, watch: Any
) -> None:
    chat = json.loads(GOOD_ROW)  # one row convert keeps, so that the scan passes
    path = data_file([{SCRIPT: IMG, "ok": 1}, {SCRIPT: IMG, "ok": 2}, IMG, chat], name=f"{IMG}.jsonl")
    start_from_form(page, path)
    job_id = job_id_of(page)
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator("#keysets tbody tr").first.locator("code")).to_have_text(f"{SCRIPT}, ok")
    expect(page.locator(".params dd").first).to_have_text(str(path))
    examples = page.locator("#issues .examples li")
    expect(examples.filter(has_text="invalid JSON")).to_have_text(re.compile(r"^line 3 invalid JSON"))
    # the pre-flight names the hostile key in its unknown_format reasons: as text, on both tables
    expect(examples.filter(has_text="no known chat shape").first).to_contain_text(SCRIPT)
    expect(page.locator("#scan-would-reject")).to_contain_text(f"no known chat shape has the keys: {SCRIPT}")
    # A failing job with the same kind of name: the error, the log and the alert show it as text too.
    empty = data_file([], name=f"{SCRIPT.replace('/', '')}.jsonl")
    start_from_form(page, empty)
    failed_id = job_id_of(page)
    expect(page.locator("#job-error")).to_contain_text(f"{empty}: empty input")
    page.goto("/alerts")
    expect(page.locator(f"li.alert:has(a[href='/jobs/{failed_id}']) .alert-msg")).to_contain_text(str(empty))
    page.goto("/jobs")
    expect(page.locator(f"tr[data-job='{job_id}']")).to_be_visible()
    page.wait_for_timeout(300)  # give any injected handler (onerror fires on load) its chance
    for url in (f"/jobs/{job_id}", f"/jobs/{failed_id}", "/alerts", "/jobs"):
        page.goto(url)
        assert page.locator("main img").count() == 0, url
        srcs = [s.get_attribute("src") for s in page.locator("script").all()]
        assert srcs == ["/static/vendor/htmx-2.0.11.min.js", "/static/live.js"], url  # ours only
    assert watch.dialogs == []


# -- (e) the jobs list is live ------------------------------------------------------------------
def test_jobs_list_updates_when_a_job_finishes(
    page: Any, server: Server, slow_file: Any, data_file: Any
) -> None:
    pipe = slow_file()
    job_id = server.submit("scan", inputs=str(pipe.path))
    pipe.open()
    pipe.write_rows([json.loads(GOOD_ROW)])
    server.wait_status(job_id, ("running",))
    page.goto("/jobs")
    mark_document(page)
    row = page.locator(f"#jobs-table tr[data-job='{job_id}']")
    expect(row.locator(".status")).to_have_text("running")
    # A job queued elsewhere (the API) shows up while we watch; it waits behind the running one.
    other = server.submit("scan", inputs=str(data_file([json.loads(GOOD_ROW)])))
    other_row = page.locator(f"#jobs-table tr[data-job='{other}']")
    expect(other_row.locator(".status")).to_have_text("queued")
    pipe.write_rows([json.loads(GOOD_ROW.replace("hi", "hi again"))])
    pipe.close()
    expect(row.locator(".status")).to_have_text("succeeded")
    expect(row.locator(".progress")).to_have_text("2 rows")
    expect(other_row.locator(".status")).to_have_text("succeeded")
    assert_not_reloaded(page)
    # One stream for the whole page, still open for the jobs to come.
    expect(page.locator("#jobs-stream")).to_have_attribute("data-sse-state", "open")


# -- (f) cancel a running job ------------------------------------------------------------------
def test_cancel_a_running_job_from_its_page(page: Any, server: Server, slow_file: Any) -> None:
    pipe = slow_file()
    start_from_form(page, pipe.path)
    job_id = job_id_of(page)
    pipe.open()
    pipe.write_rows([{"q": i} for i in range(5)])
    expect(page.locator("#job-status")).to_have_text("running")
    first_progress = time.monotonic()
    page.click("#job-live button:has-text('Cancel')")
    page.wait_for_url(f"**/jobs/{job_id}")
    expect(page.locator("#job-log")).to_contain_text("cancellation requested")
    expect(page.locator("#job-status")).to_have_text("running")  # the reader is still blocked on the pipe
    assert server.job(job_id)["status"] == "running"
    # JobContext writes progress at most every 0.5 s: let the next call through, then finish the file.
    time.sleep(max(0.0, 0.6 - (time.monotonic() - first_progress)))
    mark_document(page)
    pipe.write_rows([{"q": 99}])
    pipe.close()
    expect(page.locator("#job-status")).to_have_text("cancelled")
    assert_not_reloaded(page)
    expect(page.locator("#job-log")).to_contain_text("cancelled while running")
    expect(page.locator("#job-live button:has-text('Cancel')")).to_have_count(0)
    expect(page.locator("#job-live button:has-text('Retry')")).to_be_visible()
    job = server.job(job_id)
    assert job["status"] == "cancelled"
    assert job["outputs"] == []  # a cancelled scan writes no report


# -- the form is generated from each kind's parameters -------------------------------------------
def _kind_or_skip(server: Server, kind: str) -> dict[str, Any]:
    kinds = server.api("GET", "/api/kinds")
    if kind not in kinds:
        pytest.skip(f"no {kind!r} job kind in this checkout")
    return dict(kinds[kind]["params"]["properties"])


def test_form_sends_lists_enums_and_checkboxes_as_typed_parameters(
    page: Any, server: Server, data_file: Any
) -> None:
    props = _kind_or_skip(server, "convert")
    assert {"inputs", "to", "strict"} <= set(props)
    a = data_file([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}])
    b = data_file([{"instruction": "say hi", "input": "", "output": "hi"}])
    page.goto("/jobs/new?kind=convert")
    expect(page.locator("#new-job textarea[name=inputs]")).to_be_visible()
    page.fill("#new-job textarea[name=inputs]", f"{a}\n\n  {b}  \n")
    page.select_option("#new-job select[name=to]", "openai")
    expect(page.locator("#new-job input[name=strict]")).to_be_hidden()  # a policy: under Advanced
    page.click("#advanced > summary")
    page.check("#new-job input[name=strict]")
    page.click("#new-job button[type=submit]")
    job_id = job_id_of(page)
    params = server.job(job_id)["params"]
    assert params["inputs"] == [str(a), str(b)]
    assert params["to"] == "openai"
    assert params["strict"] is True
    expect(page.locator(".params dd ul.plain li")).to_have_text([str(a), str(b)])
    expect(page.locator("#job-status")).to_have_text(re.compile("succeeded|failed"))


def test_pairs_field_without_key_value_is_refused_on_the_form(page: Any, server: Server) -> None:
    props = _kind_or_skip(server, "tokenize")
    if props.get("template_kwargs", {}).get("type") != "object":
        pytest.skip("tokenize has no object-typed template_kwargs")
    page.goto("/jobs/new?kind=tokenize")
    page.fill("#new-job textarea[name=template_kwargs]", "enable_thinking")
    page.fill("#new-job textarea[name=inputs]", "x.jsonl")
    page.fill("#new-job input[name=tokenizer]", "tok")
    with page.expect_response(lambda r: r.url.endswith("/jobs") and r.request.method == "POST") as resp:
        page.click("#new-job button[type=submit]")
    assert resp.value.status == 400
    expect(page.locator("#form-error")).to_contain_text("takes KEY=VALUE pairs")
    expect(page.locator("#new-job textarea[name=template_kwargs]")).to_have_value("enable_thinking")
    expect(page.locator("#new-job textarea[name=inputs]")).to_have_value("x.jsonl")


# -- errors and retries --------------------------------------------------------------------------
def test_retry_from_a_failed_job_page_runs_a_new_attempt(page: Any, server: Server, data_file: Any) -> None:
    path = data_file([])
    start_from_form(page, path)
    first = job_id_of(page)
    expect(page.locator("#job-status")).to_have_text("failed")
    expect(page.locator("#job-live button:has-text('Retry')")).to_have_count(0)  # it would fail again
    path.write_text(GOOD_ROW + "\n")  # the user fixes the file: the page offers Retry now
    page.reload()
    page.click("#job-live button:has-text('Retry')")
    page.wait_for_url(re.compile(rf"/jobs/(?!{first}$)\d+$"))
    second = job_id_of(page)
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator(".params")).to_contain_text(f"job {first} (attempt 2)")
    assert server.job(second)["retry_of"] == first


def test_page_errors_are_pages_and_api_errors_stay_json(page: Any, server: Server) -> None:
    resp = page.goto("/jobs/987654")
    assert resp is not None and resp.status == 404
    expect(page.locator("h1")).to_contain_text("Not found")
    expect(page.locator("#error-message")).to_have_text("no job 987654")
    expect(page.locator("header nav a[href='/jobs']")).to_be_visible()
    resp = page.goto("/no/such/page")
    assert resp is not None and resp.status == 404
    expect(page.locator("h1")).to_contain_text("Not found")
    api = page.request.get("/api/jobs/987654")
    assert api.status == 404 and api.json() == {"detail": "no job 987654"}
    # A form posted with a stale CSRF token gets a page that says what to do.
    page.goto("/jobs/new")
    page.context.clear_cookies()
    page.fill("#new-job textarea[name=inputs]", "x.jsonl")
    with page.expect_response(lambda r: r.url.endswith("/jobs") and r.request.method == "POST") as posted:
        page.click("#new-job button[type=submit]")
    assert posted.value.status == 403
    expect(page.locator("#error-message")).to_contain_text("reload the page and try again")


def test_cancel_of_a_job_that_already_ended_just_shows_the_job(
    page: Any, server: Server, slow_file: Any
) -> None:
    pipe = slow_file()
    job_id = server.submit("scan", inputs=str(pipe.path))
    pipe.open()
    pipe.write_rows([json.loads(GOOD_ROW)])
    server.wait_status(job_id, ("running",))
    # Freeze the page as it loads (its stream ends at once, asking for a reconnect in 10 minutes), finish
    # the job behind its back, then click the stale Cancel.
    page.route(
        "**/jobs/*/events*",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body="retry: 600000\n\n"),
    )
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("#job-status")).to_have_text("running")
    pipe.close()
    server.wait_status(job_id)
    with page.expect_response(lambda r: r.url.endswith("/cancel")) as cancelled:
        page.click("#job-live button:has-text('Cancel')")
    assert cancelled.value.status == 303
    page.wait_for_url(f"**/jobs/{job_id}")
    expect(page.locator("#job-status")).to_have_text("succeeded")


# -- a server with a token ---------------------------------------------------------------------
def test_token_server_asks_to_sign_in_then_runs_the_job(browser: Any, tmp_path: Path, watch: Any) -> None:
    server = Server(tmp_path / "home", extra_env={"DRAFTDECK_TOKEN": "s3cret-token"}).start()
    context = browser.new_context(base_url=server.url)
    try:
        page = context.new_page()
        page.on("dialog", lambda d: (watch.dialogs.append(d.message), d.dismiss()))
        target = server.data_dir / "a.jsonl"
        target.write_text(GOOD_ROW + "\n")
        start_from_form(page, target)
        expect(page.locator("h1")).to_contain_text("Sign in needed")
        expect(page.locator("#error-message")).to_contain_text("sign in at /login")
        page.click("main a[href='/login']")
        # A wrong token is said to be wrong, right there; the right one signs in.
        page.fill("input[name=token]", "wrong")
        page.click("main form button[type=submit]")
        expect(page.locator("#login-error")).to_contain_text("that token is wrong")
        assert page.url.endswith("/login")
        page.fill("input[name=token]", "s3cret-token")
        page.click("main form button[type=submit]")
        page.wait_for_url("**/jobs")
        start_from_form(page, target)
        job_id_of(page)
        expect(page.locator("#job-status")).to_have_text("succeeded")
        assert watch.dialogs == []
    finally:
        context.close()
        server.stop()
    assert "Traceback" not in server.log_text()


# -- layout: nothing sticks out of a phone screen -------------------------------------------------
def test_pages_fit_a_narrow_screen_with_long_paths(browser: Any, server: Server, data_file: Any) -> None:
    deep = server.data_dir / ("a-rather-long-folder-name-" * 3) / "and_an_even_longer_file_name_for_a_dataset"
    deep.mkdir(parents=True)
    good = data_file(
        [{"messages": []}, "{bad", {"k" * 120: 1}, json.loads(GOOD_ROW)],
        name=str(deep.relative_to(server.data_dir) / "x.jsonl"),
    )
    empty = data_file([], name=str(deep.relative_to(server.data_dir) / "empty.jsonl"))
    ok_id, failed_id = server.submit("scan", inputs=str(good)), server.submit("scan", inputs=str(empty))
    server.wait_status(ok_id)
    server.wait_status(failed_id)
    context = browser.new_context(base_url=server.url, viewport={"width": 390, "height": 844})
    try:
        page = context.new_page()
        for url in ("/jobs", "/jobs/new", f"/jobs/{ok_id}", f"/jobs/{failed_id}", "/alerts"):
            page.goto(url)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{url} is {width} px wide on a 390 px screen"
        page.goto(f"/jobs/{ok_id}")
        # Wide content scrolls inside its table, not the page.
        wrap = page.locator("#keysets").locator("xpath=..")
        assert wrap.evaluate("e => getComputedStyle(e).overflowX") == "auto"
    finally:
        context.close()


def test_file_picker_fills_the_form_and_shows_the_resolved_paths_on_a_narrow_screen(
    page: Any, server: Server, data_file: Any
) -> None:
    """At 390 px: Browse data roots -> the home -> data/ -> "use" a file puts its absolute path in
    the inputs; a relative `out` shows the absolute path it will use; the job writes exactly there.
    A hostile file name is listed as text (the page fixture fails on any dialog or script error)."""
    page.set_viewport_size({"width": 390, "height": 844})
    sub = server.data_dir / "picked"
    sub.mkdir(exist_ok=True)
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    good = data_file([chat], name="picked/chat.jsonl")
    data_file([{"messages": []}], name="picked/<img src=x onerror=alert(1)>.jsonl")
    page.goto("/jobs/new?kind=convert")
    page.click("#new-job button.picker-open[hx-target='#picker-inputs']")
    home = server.home.resolve()
    page.click(f"#picker-inputs button.picker-name[title='{home}']")
    page.click(f"#picker-inputs button.picker-name[title='{home / 'data'}']")
    page.click(f"#picker-inputs button.picker-name[title='{home / 'data' / 'picked'}']")
    listing = page.locator("#picker-inputs .picker-entry")
    expect(listing.filter(has_text="chat.jsonl")).to_contain_text("JSONL")
    expect(listing.filter(has_text="onerror")).to_contain_text("<img src=x onerror=alert(1)>.jsonl")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the form with the picker open is {width} px wide on a 390 px screen"
    listing.filter(has_text="chat.jsonl").locator("button.picker-use").click()
    expect(page.locator("#new-job textarea[name=inputs]")).to_have_value(str(good.resolve()))
    expect(page.locator("#resolved-inputs")).to_contain_text(str(good.resolve()))
    page.select_option("#new-job select[name=to]", "openai")
    page.fill("#new-job input[name=out]", "data/from_picker.jsonl")
    where = home / "data" / "from_picker.jsonl"
    expect(page.locator("#resolved-out")).to_have_text(f"→ {where}")
    page.click("#new-job button[type=submit]")
    job_id = job_id_of(page)
    job = server.wait_status(job_id)
    assert job["status"] == "succeeded" and job["params"]["out"] == str(where) and where.exists()
