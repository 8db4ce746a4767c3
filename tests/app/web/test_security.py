"""Who may read and write: the token beyond loopback, the app's own refusal without one, sign-in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import REPO_ROOT
from tests.support.web import form_token

REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: a client on another machine
LOCAL = ("127.0.0.1", 40000)
TOKEN = "s3cret-token"


def _app(monkeypatch: pytest.MonkeyPatch, host: str | None = None, token: str | None = None):
    from app.settings import get_settings
    from app.web.main import create_app

    if host:
        monkeypatch.setenv("DRAFTDECK_HOST", host)
    if token:
        monkeypatch.setenv("DRAFTDECK_TOKEN", token)
    get_settings.cache_clear()
    return create_app()


@pytest.fixture
def exposed(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """`draftdeck web --host 0.0.0.0` with a token, reached from this machine."""
    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    with TestClient(_app(monkeypatch, "0.0.0.0", TOKEN), client=LOCAL) as c:
        yield c


READS = ["/api/jobs", "/api/jobs/1", "/api/alerts", "/api/kinds", "/jobs", "/jobs/new", "/datasets",
         "/datasets/1", "/datasets/1/rows/0", "/datasets/1/rows/0/source", "/datasets/1/stats.json",
         "/alerts", "/openapi.json", "/docs", "/serving", "/serving/1", "/api/serving"]  # fmt: skip


@pytest.mark.parametrize("url", READS)
def test_reads_beyond_loopback_need_the_token(exposed: TestClient, url: str) -> None:
    r = exposed.get(url)
    assert r.status_code == 401, (url, r.status_code, r.text[:200])
    assert "token" in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
    authed = exposed.get(url, headers={"authorization": f"Bearer {TOKEN}"})
    assert authed.status_code in (200, 404), (url, authed.status_code)  # 404: job/dataset 1 does not exist
    wrong = exposed.get(url, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_a_browser_is_sent_to_sign_in_and_back(exposed: TestClient) -> None:
    r = exposed.get("/datasets?x=1", headers={"accept": "text/html"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fdatasets%3Fx%3D1"
    page = exposed.get(r.headers["location"], headers={"accept": "text/html"})
    assert page.status_code == 200 and 'name="next" value="/datasets?x=1"' in page.text
    for open_url in ("/static/app.css", "/healthz"):
        assert exposed.get(open_url).status_code == 200, open_url
    csrf = form_token(exposed)
    signed = exposed.post(
        "/login", data={"token": TOKEN, "csrf": csrf, "next": "/datasets?x=1"}, follow_redirects=False
    )
    assert signed.status_code == 303 and signed.headers["location"] == "/datasets?x=1"
    session = exposed.cookies["dd_session"]
    assert TOKEN not in session  # the cookie is derived from the token, not the token
    assert exposed.get("/api/jobs").status_code == 200
    assert exposed.get("/jobs", headers={"accept": "text/html"}).status_code == 200
    # the session cookie signs writes too (with the form's CSRF token)
    made = exposed.post(
        "/jobs", data={"kind": "scan", "inputs": "data/a.jsonl", "csrf": csrf}, follow_redirects=False
    )
    assert made.status_code == 303 and made.headers["location"].startswith("/jobs/")


def test_a_wrong_token_is_refused_at_sign_in(exposed: TestClient) -> None:
    exposed.get("/login")
    csrf = form_token(exposed)
    r = exposed.post("/login", data={"token": "wrong", "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 401 and "that token is wrong" in r.text
    assert 'id="login-error"' in r.text and "dd_session" not in r.headers.get("set-cookie", "")
    assert "dd_session" not in exposed.cookies
    assert exposed.get("/api/jobs").status_code == 401


def test_sign_in_never_redirects_off_site(exposed: TestClient) -> None:
    exposed.get("/login")
    csrf = form_token(exposed)
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example", "jobs"):
        r = exposed.post(
            "/login", data={"token": TOKEN, "csrf": csrf, "next": target}, follow_redirects=False
        )
        assert r.headers["location"] == "/jobs", target


def test_htmx_polls_get_401_and_a_redirect_hint(exposed: TestClient) -> None:
    r = exposed.get("/jobs/table", headers={"hx-request": "true", "accept": "text/html"})
    assert r.status_code == 401 and r.headers["hx-redirect"] == "/login"


HOSTS = {
    # (Host header, what `draftdeck up` on 127.0.0.1 answers)
    "localhost:8000": 200,
    "127.0.0.1:8000": 200,
    "[::1]:8000": 200,
    "app.localhost": 200,
    "testserver": 200,  # named in DRAFTDECK_ALLOWED_HOSTS (tests/conftest.py)
    "rebind.attacker.example:8000": 400,  # DNS rebinding: the page's own name, resolved to this machine
    "127.0.0.1.attacker.example": 400,
    "10.0.0.5:8000": 400,  # an address it does not listen on
    "": 400,
}


@pytest.mark.parametrize("host,status", HOSTS.items())
def test_the_server_answers_only_host_names_it_was_configured_for(
    migrated: Path, monkeypatch: pytest.MonkeyPatch, host: str, status: int
) -> None:
    """A DNS-rebinding page reads nothing and submits nothing: no dataset sample, no job."""
    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    with TestClient(_app(monkeypatch, "127.0.0.1"), client=LOCAL) as c:
        for method, url in (("GET", "/api/jobs"), ("GET", "/datasets"), ("POST", "/api/jobs")):
            body = {"kind": "scan", "params": {"inputs": ["data/a.jsonl"]}} if method == "POST" else None
            r = c.request(method, url, headers={"host": host}, json=body)
            got = 200 if r.status_code in (200, 201) else r.status_code
            assert got == status, (host, method, url, r.status_code)
            if status == 400:
                assert "--allowed-hosts" in r.json()["detail"]
        assert c.get("/healthz", headers={"host": host}).status_code == 200  # probes may name anything


def test_allowed_hosts_and_every_interface(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTDECK_ALLOWED_HOSTS", "dash.example.org, .corp.example")
    with TestClient(_app(monkeypatch, "127.0.0.1"), client=LOCAL) as c:
        named = {"dash.example.org": 200, "gpu7.corp.example:8000": 200, "corp.example": 200,
                 "evil.example.org": 400, "notcorp.example": 400}  # fmt: skip
        for host, status in named.items():
            assert c.get("/api/jobs", headers={"host": host}).status_code == status, host
    # listening on every interface: the machine's addresses are names too (no rebinding uses an address)
    with TestClient(_app(monkeypatch, "0.0.0.0", TOKEN), client=LOCAL) as c:
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert c.get("/api/jobs", headers={"host": "10.0.0.5:8000", **auth}).status_code == 200
        assert c.get("/api/jobs", headers={"host": "gpu-box.lan:8000", **auth}).status_code == 400


def test_a_csrf_token_is_the_server_s_signature_not_an_echo(
    migrated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page on another port of this host can set the dd_csrf cookie (cookies know no ports) and post a
    form carrying the same value: refused. The token the server's own page gives works."""
    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    form = {"kind": "scan", "inputs": "data/a.jsonl"}
    with TestClient(_app(monkeypatch, "127.0.0.1"), client=LOCAL) as c:
        c.cookies.set("dd_csrf", "chosen-by-the-attacker")
        forged = c.post("/jobs", data={**form, "csrf": "chosen-by-the-attacker"}, follow_redirects=False)
        assert forged.status_code == 403 and "CSRF" in forged.text
        assert (
            c.post("/jobs", data=form, headers={"x-csrf-token": "chosen-by-the-attacker"}).status_code == 403
        )
        token = form_token(c)  # signed for the cookie it carries, with the server's secret
        assert token != "chosen-by-the-attacker"
        ok = c.post("/jobs", data={**form, "csrf": token}, follow_redirects=False)
        assert ok.status_code == 303, ok.text
    key = migrated / "secret"
    assert key.stat().st_mode & 0o777 == 0o600  # made once in the home, for its owner only


def test_loopback_server_stays_open_for_reads(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with TestClient(_app(monkeypatch, "127.0.0.1", TOKEN), client=LOCAL) as c:
        assert c.get("/api/jobs").status_code == 200
        assert c.get("/jobs").status_code == 200
        body = {"kind": "scan", "params": {"inputs": ["x"]}}
        assert c.post("/api/jobs", json=body).status_code == 401  # writes still need the token
        # a served endpoint makes the server fetch a URL on its own: registering one is a write
        endpoint = {"name": "x", "kind": "vllm", "metrics_url": "http://127.0.0.1:9/metrics"}
        assert c.post("/api/serving", json=endpoint).status_code == 401


def test_a_remote_client_needs_the_token_whatever_the_settings_say(
    migrated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`uvicorn app.web.main:app --host 0.0.0.0` with DRAFTDECK_TOKEN set: the settings keep the
    loopback default, the peer's address says the truth."""
    with TestClient(_app(monkeypatch, token=TOKEN), client=REMOTE) as c:
        assert c.get("/api/jobs").status_code == 401
        assert c.get("/api/jobs", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    with TestClient(_app(monkeypatch, token=TOKEN), client=("::ffff:127.0.0.1", 1)) as c:
        assert c.get("/api/jobs").status_code == 200  # IPv4 loopback over an IPv6 socket


def test_without_a_token_remote_clients_are_refused(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    body = {"kind": "scan", "params": {"inputs": ["data/a.jsonl"]}}
    with TestClient(_app(monkeypatch), client=REMOTE) as c:
        for method, url in (
            ("get", "/api/jobs"),
            ("get", "/jobs"),
            ("get", "/login"),
            ("get", "/static/app.css"),
        ):
            r = c.request(method, url)
            assert r.status_code == 403 and "DRAFTDECK_TOKEN" in r.json()["detail"], url
        assert c.post("/api/jobs", json=body).status_code == 403
        assert c.get("/healthz").status_code == 200
    with TestClient(_app(monkeypatch), client=LOCAL) as c:
        assert c.post("/api/jobs", json=body).status_code == 201


def _lan_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str, data: bytes | None = None) -> int:
    headers = {"content-type": "application/json"} if data is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_plain_uvicorn_on_all_interfaces_without_a_token(migrated: Path) -> None:
    """The app, not `draftdeck web`, refuses: a real uvicorn on 0.0.0.0 answers 403 on the LAN
    address and 200 on loopback."""
    lan = _lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DRAFTDECK_TOKEN", "DRAFTDECK_HOST")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.web.main:app", "--host", "0.0.0.0", "--port", str(port)],
        cwd=migrated,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if _status(f"http://127.0.0.1:{port}/healthz") == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.1)
        assert _status(f"http://127.0.0.1:{port}/api/jobs") == 200
        assert _status(f"http://{lan}:{port}/api/jobs") == 403
        job = b'{"kind": "scan", "params": {"inputs": ["x"]}}'
        assert _status(f"http://{lan}:{port}/api/jobs", data=job) == 403
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- paths: one rule, and the New-job form's picker only inside the roots ------------------------------


def test_one_path_rule_for_server_and_cli(tmp_path: Path) -> None:
    from draftdeck.paths import resolve_user_path

    data, var = tmp_path / "data", tmp_path / "var"
    roots = [data, var]
    for where in (tmp_path, tmp_path / "elsewhere"):
        assert resolve_user_path("/abs/x.jsonl", roots, cwd=where) == Path("/abs/x.jsonl")
    assert resolve_user_path("data/x.jsonl", roots, cwd=tmp_path) == data / "x.jsonl"
    assert resolve_user_path("var/datasets/big", roots, cwd=tmp_path) == var / "datasets" / "big"
    assert resolve_user_path("x.jsonl", roots, cwd=tmp_path) == data / "x.jsonl"  # the first root
    assert resolve_user_path("x.jsonl", roots, cwd=data) == data / "x.jsonl"  # the cwd lies in a root
    # the CLI has no sandbox: a relative path is from its working folder, whatever the roots
    assert resolve_user_path("data/x.jsonl", None, cwd=tmp_path) == tmp_path / "data" / "x.jsonl"
    assert resolve_user_path("x.jsonl", None, cwd=tmp_path) == tmp_path / "x.jsonl"


@pytest.fixture
def picker(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    data = migrated / "data"
    (data / "sets").mkdir()
    (data / "sets" / "train.parquet").write_bytes(b"PAR1" + b"\0" * 60)
    (data / "<img src=x onerror=alert(1)>.jsonl").write_text('{"messages": []}\n')
    (data / "rows.json.gz").write_bytes(b"\x1f\x8b")
    (data / "tok").mkdir()
    (data / "tok" / "tokenizer.json").write_text("{}")
    (migrated.parent / "secret").mkdir()
    (data / "escape").symlink_to(migrated.parent / "secret")
    with TestClient(_app(monkeypatch)) as c:
        yield c


def test_the_picker_lists_roots_folders_and_files_with_size_and_kind(
    picker: TestClient, migrated: Path
) -> None:
    roots = picker.get("/jobs/new/files", params={"field": "inputs"})
    assert roots.status_code == 200 and f'data-pick-path="{migrated.resolve()}"' in roots.text
    page = picker.get("/jobs/new/files", params={"field": "inputs", "dir": str(migrated / "data")})
    assert page.status_code == 200
    text = page.text
    assert "<img src=x" not in text and "&lt;img src=x onerror=alert(1)&gt;.jsonl" in text  # escaped
    assert "sets/" in text and "JSONL · 17 B" in text and "JSON, gzip" in text and ">tokenizer<" in text
    assert text.index("sets/") < text.index("rows.json.gz")  # folders first
    inner = picker.get("/jobs/new/files", params={"field": "inputs", "dir": "data/sets"})  # the one rule
    assert "train.parquet" in inner.text and "Parquet · 64 B" in inner.text


@pytest.mark.parametrize("bad", ["/etc", "../..", "data/escape", "data/../../secret"])
def test_the_picker_lists_nothing_outside_the_roots(picker: TestClient, bad: str) -> None:
    r = picker.get("/jobs/new/files", params={"field": "inputs", "dir": bad})
    assert r.status_code == 400 and "outside the data roots" in r.text
    assert (
        picker.get("/jobs/new/files", params={"field": 'x" onmouseover=1', "dir": "data"}).status_code == 400
    )


def test_the_form_shows_the_absolute_path_a_field_will_use(picker: TestClient, migrated: Path) -> None:
    r = picker.get("/jobs/new/resolve", params={"kind": "convert", "field": "out", "out": "data/x.jsonl"})
    assert f'→ <code class="path">{(migrated / "data" / "x.jsonl").resolve()}</code>' in r.text
    typed = "data/sets/train.parquet\nnope.jsonl\n/etc/passwd"
    r = picker.get("/jobs/new/resolve", params={"kind": "convert", "field": "inputs", "inputs": typed})
    assert str((migrated / "data" / "sets" / "train.parquet").resolve()) in r.text
    assert "nope.jsonl" in r.text and "no such file" in r.text and "outside the data roots" in r.text
    form = picker.get("/jobs/new?kind=convert").text
    assert 'hx-get="/jobs/new/resolve"' in form and 'hx-get="/jobs/new/files?field=out"' in form


def test_first_start_creates_the_default_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import Settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DRAFTDECK_DATA_ROOTS", raising=False)
    Settings(home=tmp_path / "var").ensure_dirs()  # what `draftdeck up` and `web` run first
    assert (tmp_path / "data").is_dir()


def test_make_up_takes_a_port() -> None:
    r = subprocess.run(["make", "-n", "-o", ".venv/.installed", "up", "PORT=8001"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 0 and "draftdeck up --host 127.0.0.1 --port 8001" in r.stdout
