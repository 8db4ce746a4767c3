"""docker-compose.yml stays consistent with the settings (no Docker engine runs here)."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from app.queue import QUEUES
from app.settings import Settings
from tests.conftest import REPO_ROOT


def test_compose_matches_settings_and_queues() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "postgres", "web", "cpu-worker", "gpu-worker"} <= set(services)
    env = compose["x-draftdeck"]["environment"]
    known = {"DATABASE_URL", "REDIS_URL"} | {f"DRAFTDECK_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= known, set(env) - known
    settings = Settings(database_url=env["DATABASE_URL"], redis_url=env["REDIS_URL"])
    assert settings.db_url.startswith("postgresql+psycopg://") and not settings.embedded
    for name in ("cpu-worker", "gpu-worker"):
        cmd = services[name]["command"]
        queues = cmd[cmd.index("--queues") + 1].split(",")
        assert set(queues) <= set(QUEUES)
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"


def test_redis_keeps_its_data() -> None:
    """A restarted Redis keeps the broker's messages: append-only file on a named volume at /data
    (the redis image's working directory, where the file is written)."""
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    redis = compose["services"]["redis"]
    cmd = redis["command"]
    assert cmd[cmd.index("--appendonly") + 1] == "yes", cmd
    assert "--save" not in cmd or cmd[cmd.index("--save") + 1] != "", cmd
    mounts = {m.split(":")[1]: m.split(":")[0] for m in redis["volumes"]}
    assert "/data" in mounts and mounts["/data"] in compose["volumes"], redis["volumes"]


def test_docker_compose_config_where_the_client_exists() -> None:
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        import pytest

        pytest.skip("no `docker compose` client on this machine")
    out = subprocess.run(
        [docker, "compose", "config", "--quiet"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={"DRAFTDECK_TOKEN": "x", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
