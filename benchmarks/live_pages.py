# ruff: noqa: E402 - imports follow the sys.path fix
"""Live job pages: one SSE stream per viewer against the 1 s htmx polling it replaced.

    python benchmarks/live_pages.py [--viewers 10] [--seconds 8]

Starts `draftdeck web` (no worker: the job is moved by this process, straight in SQL) on a fresh home,
then, for each way of watching, `--viewers` clients watch one running job for `--seconds`: the web
process's CPU seconds (from /proc), requests and bytes sent to the clients, and how long a progress
update takes to reach a client (median over the updates this process writes every 0.7 s). Polling
asks GET /jobs/{id}/live every second, as the pages did; SSE holds GET /jobs/{id}/events open.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/ holds tokenize.py, which would shadow the stdlib module.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import http.client
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Tally:
    requests: int = 0
    bytes: int = 0
    seen: dict[int, float] = field(default_factory=dict)  # progress value -> when a client first saw it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, value: int) -> None:
        with self.lock:
            self.seen.setdefault(value, time.monotonic())


def poller(port: int, job_id: int, stop: threading.Event, tally: Tally) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        conn.request("GET", f"/jobs/{job_id}/live", headers={"hx-request": "true"})
        body = conn.getresponse().read()
        with tally.lock:
            tally.requests += 1
            tally.bytes += len(body)
        m = re.search(rb"(\d[\d,]*) rows", body)
        if m:
            tally.saw(int(m.group(1).replace(b",", b"")))
        stop.wait(1.0)
    conn.close()


def streamer(port: int, job_id: int, stop: threading.Event, tally: Tally) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/jobs/{job_id}/events")
    resp = conn.getresponse()
    with tally.lock:
        tally.requests += 1
    while not stop.is_set():
        line = resp.fp.readline()
        if not line:
            break
        with tally.lock:
            tally.bytes += len(line)
        m = re.search(rb'"label":"(\d[\d,]*) rows"', line)
        if m:
            tally.saw(int(m.group(1).replace(b",", b"")))
    conn.close()


def watch(kind: str, port: int, pid: int, job_id: int, viewers: int, seconds: float) -> dict[str, float]:
    from sqlmodel import Session

    from app.store import records
    from app.store.db import get_engine

    tally, stop = Tally(), threading.Event()
    target = poller if kind == "polling" else streamer
    threads = [threading.Thread(target=target, args=(port, job_id, stop, tally)) for _ in range(viewers)]
    cpu0 = cpu_seconds(pid)
    for t in threads:
        t.start()
    written: dict[int, float] = {}
    start = time.monotonic()
    value = 0
    with Session(get_engine()) as session:
        while time.monotonic() - start < seconds:
            time.sleep(0.7)
            value += 1000 + (1 if kind == "sse" else 0)  # distinct values per run
            written[value] = time.monotonic()
            records.record_progress(session, job_id, value, None, "rows")
    time.sleep(1.2)  # the last update reaches everyone
    stop.set()
    cpu = cpu_seconds(pid) - cpu0
    for t in threads:
        t.join(timeout=2)
    delays = [tally.seen[v] - at for v, at in written.items() if v in tally.seen]
    return {
        "cpu_s": cpu,
        "requests": tally.requests,
        "kib": tally.bytes / 1024,
        "delay_ms": 1000 * statistics.median(delays) if delays else float("nan"),
        "updates_seen": len(delays) / len(written),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--viewers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny: checks the script runs, measures nothing",
    )
    args = parser.parse_args()
    if args.smoke:  # long enough for a few of the 0.7 s updates to reach each viewer
        args.viewers, args.seconds = 2, 2.0
    home = Path(tempfile.mkdtemp(prefix="dd-live-bench-"))
    (home / "data").mkdir()
    (home / "data" / "a.jsonl").write_text('{"a": 1}\n')
    os.environ.update(DRAFTDECK_HOME=str(home), DRAFTDECK_DATA_ROOTS=str(home))
    for var in ("DATABASE_URL", "REDIS_URL", "DRAFTDECK_TOKEN"):
        os.environ.pop(var, None)
    from tests.browser.harness import free_port

    port = free_port()
    exe = Path(sys.executable).parent / "draftdeck"
    log = open(home / "web.log", "wb")  # noqa: SIM115 - the child holds it
    web = subprocess.Popen([str(exe), "web", "--port", str(port)], cwd=home, stdout=log, stderr=log)
    try:
        for _ in range(300):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        from sqlmodel import Session

        from app.store import records, state
        from app.store.db import get_engine
        from app.store.models import JobStatus

        with Session(get_engine()) as session:
            job = records.create_job(session, "scan", {"path": str(home / "data" / "a.jsonl")}, "cpu")
            job_id = job.id
            assert job_id is not None and state.propose(session, job_id, JobStatus.RUNNING, "bench").accepted
        rows = {
            kind: watch(kind, port, web.pid, job_id, args.viewers, args.seconds)
            for kind in ("polling", "sse")
        }
    finally:
        web.terminate()
        web.wait(timeout=10)
    p, s = rows["polling"], rows["sse"]
    print(f"{args.viewers} viewers of one running job for {args.seconds:.0f} s (web process; one run)\n")
    print("| watching | web CPU s | requests | KiB sent | update reaches a viewer (median) | updates seen |")
    print("|---|---|---|---|---|---|")
    for kind, r in rows.items():
        print(f"| {kind} | {r['cpu_s']:.2f} | {r['requests']} | {r['kib']:.0f} | {r['delay_ms']:.0f} ms "
              f"| {r['updates_seen']:.0%} |")  # fmt: skip
    print(f"\nSSE / polling: CPU {s['cpu_s'] / p['cpu_s']:.2f}, bytes {s['kib'] / p['kib']:.2f}, "
          f"delay {s['delay_ms'] / p['delay_ms']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
