"""Where `draftdeck up` (or `web`) serves, recorded under the home, so that `draftdeck jobs` talks to
the server this checkout started without `--server` or DRAFTDECK_SERVER.

The record is ``<home>/server.json``: ``{"url", "pid"}``. It names a server only while that process
runs: the server removes it when it returns, and a record left by one that died of a signal (uvicorn
re-raises SIGTERM once it has shut down) names a process that is gone and is not followed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RECORD = "server.json"


def record(home: Path, host: str, port: int) -> Path:
    """Record that this process serves on `host`:`port`; a wildcard address is reached on loopback."""
    reach = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    url = f"http://[{reach}]:{port}" if ":" in reach else f"http://{reach}:{port}"
    path = home / RECORD
    home.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    tmp.replace(path)
    return path


def forget(home: Path) -> None:
    """Remove this process's record (another server's stays)."""
    path = home / RECORD
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def recorded(home: Path) -> str | None:
    """The URL of the live server recorded under `home`, or None."""
    try:
        data = json.loads((home / RECORD).read_text())
        url, pid = data["url"], int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # the server that wrote it is gone
    except PermissionError:
        pass  # alive, another user's
    return str(url)
