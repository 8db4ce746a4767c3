# ruff: noqa: E501 - command lines and messages read best unwrapped
"""The peer of benchmarks/tokenize.py: speculators 0.9.0 ``prepare-data``, installed on demand into its
own venv, fed by a loopback render server with the same tokenizer (see that file's docstring)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

WORK = Path(__file__).resolve().parent / ".work"

PEER = "speculators 0.9.0 prepare-data"
PEER_VERSION = "0.9.0"
PEER_VENV = WORK / "speculators-venv"


def _tail(path: Path, n: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip()[0] not in "│╭╰"]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-400:]


def peer_install(venv: Path = PEER_VENV) -> tuple[Path | None, str]:
    """The peer's `speculators` command, installed into `venv` with DOMAIN.md's CPU recipe when it is
    not there yet (torch 2.13.0 from the local wheel first, then speculators 0.9.0 with torch pinned to
    the +cpu build, then torchvision/torchaudio removed: their import fails without CUDA ops).
    Returns (command, "") or (None, why not)."""
    import subprocess

    py, cli = venv / "bin" / "python", venv / "bin" / "speculators"
    probe = (
        "import importlib.metadata as m, sys; v = m.version('speculators'); "
        f"sys.exit(0 if v == '{PEER_VERSION}' else 'speculators ' + v + ' installed, not {PEER_VERSION}'); "
    )
    check = probe + "import speculators.data_generation.preprocessing"
    if py.exists() and cli.exists():
        r = subprocess.run([str(py), "-c", check], capture_output=True, text=True)
        if r.returncode == 0:
            return cli, ""
        print(
            f"peer venv {venv} is not usable ({(r.stderr or r.stdout).strip().splitlines()[-1:]}): reinstalling"
        )
    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / "speculators-install.log"
    constraints = WORK / "speculators-constraints.txt"
    constraints.write_text("torch==2.13.0+cpu\n")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    steps = [
        ("create venv", [sys.executable, "-m", "venv", "--clear", str(venv)]),
        ("pip install torch==2.13.0", [*pip, "torch==2.13.0"]),
        (f"pip install speculators=={PEER_VERSION}",
         [*pip, f"speculators=={PEER_VERSION}", "torchvision==0.28.0", "-c", str(constraints)]),
        ("pip uninstall torchvision torchaudio", [str(py), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio"]),
        ("import check", [str(py), "-c", check]),
    ]  # fmt: skip
    print(f"installing the peer ({PEER}, ~1.5 GB) into {venv}; log: {log}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        for name, cmd in steps:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            try:
                done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
            except OSError as exc:
                return None, f"install failed at {name}: {exc}"
            if done.returncode != 0:
                f.close()
                return None, f"install failed at {name} (exit {done.returncode}): {_tail(log)} (log {log})"
    print(f"peer installed in {time.perf_counter() - t0:.0f} s", flush=True)
    return cli, ""


def write_sharegpt(convs: list, path: Path) -> None:
    """The conversations as ShareGPT `conversations` rows (the key prepare-data reads; it maps
    role/content as well as from/value). Tool-call arguments become JSON strings (what HF's `tojson`
    would print for them) and tools a JSON string column, so Arrow's schema inference across rows
    neither fails nor adds null keys to argument objects."""
    from draftdeck.chat.render import conversation_dicts

    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for c in convs:
            msgs = conversation_dicts(c)
            for m in msgs:
                for tc in m.get("tool_calls") or ():
                    a = tc["function"]["arguments"]
                    if not isinstance(a, str):
                        tc["function"]["arguments"] = json.dumps(a, ensure_ascii=False)
            # every row has `tools` ("" = none, which prepare-data reads as no tools): a column that
            # first appears after datasets' first JSON block fails its schema cast
            row = {"conversations": msgs, "tools": json.dumps(c.tools, ensure_ascii=False) if c.tools else ""}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


class RenderServer:
    """benchmarks/_render_server.py as a child process on 127.0.0.1."""

    def __init__(self, tok_dir: Path) -> None:
        import subprocess

        script = Path(__file__).resolve().parent / "_render_server.py"
        self.log = WORK / "render-server.log"
        self.log_file = open(self.log, "w")  # noqa: SIM115 - the server's stderr for its lifetime
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "--tokenizer", str(tok_dir), "--port", "0"],
            stdout=subprocess.PIPE, stderr=self.log_file, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("READY "):
            self.close()
            raise RuntimeError(f"render server did not start: {_tail(self.log)}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def render(
        self, messages: list[dict], add_generation_prompt: bool, tools: list | None
    ) -> tuple[int, dict]:
        body: dict = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        if tools:
            body["tools"] = tools
        return self._call("POST", "/v1/chat/completions/render", body)

    def stats(self) -> dict:
        return self._call("GET", "/stats")[1]

    def reset(self) -> None:
        self._call("GET", "/reset")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait()
        self.log_file.close()


def check_server(server: RenderServer, tok, path: Path, n: int = 8) -> str:
    """The stand-in's ids for every prefix speculators renders (prompt with generation prompt, turn
    without) of the first `n` conversations of the peer's input, against HF `apply_chat_template`.
    Returns a one-line summary; raises if any differ."""
    done = renders = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if done >= n:
                break
            row = json.loads(line)
            msgs, tools = row["conversations"], json.loads(row["tools"]) if row.get("tools") else None
            if not any(m["role"] == "user" for m in msgs):
                continue
            done += 1
            for j, m in enumerate(msgs):
                if m["role"] != "assistant" or j == 0:
                    continue
                for prefix, gen in ((msgs[:j], True), (msgs[: j + 1], False)):
                    status, got = server.render(prefix, gen, tools)
                    want = tok.apply_chat_template(
                        prefix, tools=tools, add_generation_prompt=gen, tokenize=True
                    )
                    want = list(want["input_ids"] if hasattr(want, "keys") else want)
                    if status != 200 or got.get("token_ids") != want:
                        raise RuntimeError(
                            f"render stand-in differs from HF apply_chat_template: {status} {str(got)[:200]}"
                        )
                    renders += 1
    return (
        f"render stand-in checked: {renders} renders of {done} conversations equal HF apply_chat_template ids"
    )


def run_peer(
    cli: Path, tok_dir: Path, data: Path, seq_length: int, workers: int, server: RenderServer
) -> dict:
    """One timed `speculators prepare-data` run; its output's rows, tokens and trained tokens."""
    import resource
    import subprocess

    import pyarrow as pa
    import pyarrow.compute as pc

    out = WORK / "peer-out"
    shutil.rmtree(out, ignore_errors=True)
    log = WORK / "peer-prepare-data.log"
    cmd = [str(cli), "prepare-data", "--model", str(tok_dir), "--data", str(data), "--output", str(out),
           "--seq-length", str(seq_length), "--num-preprocessing-workers", str(workers),
           "--render-endpoint", server.url]  # fmt: skip
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(WORK / "peer-hf-home"),
    }
    s0 = server.stats()
    k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s1 = server.stats()
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {_tail(log)} (log {log})")
    rows = tokens = trained = longest = 0
    for shard in sorted(out.glob("*.arrow")):
        with pa.memory_map(str(shard)) as src:
            t = pa.ipc.open_stream(src).read_all()
        rows += t.num_rows
        if t.num_rows:
            tokens += pc.sum(t["seq_len"]).as_py()
            longest = max(longest, pc.max(t["seq_len"]).as_py())
            trained += pc.sum(pc.list_flatten(t["loss_mask"])).as_py()
    text = log.read_text(errors="replace")
    return {
        "wall": wall,
        "cpu": (k1.ru_utime + k1.ru_stime - k0.ru_utime - k0.ru_stime) + (s1["cpu_s"] - s0["cpu_s"]),
        "server_cpu": s1["cpu_s"] - s0["cpu_s"],
        "render_span": (s1["last"] or 0) - (s1["first"] or 0) if s1["requests"] > s0["requests"] else 0.0,
        "renders": s1["requests"] - s0["requests"],
        "render_errors": s1["errors"] - s0["errors"],
        "failed_convs": text.count("Failed to process conversation"),
        "rows": rows, "tokens": tokens, "trained": trained, "longest": longest,
        "input_mb": data.stat().st_size / 1e6,
    }  # fmt: skip
