"""One settings object, read from the environment (DRAFTDECK_*, DATABASE_URL, REDIS_URL)."""

from __future__ import annotations

import ipaddress
import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback, which Python 3.11 does not say
    return ip.is_loopback


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DRAFTDECK_", extra="ignore")

    home: Path = Field(default=Path("var"), description="where embedded state, jobs and outputs live")
    # the built documentation site served under /guide; by default site/ beside the package (a checkout)
    guide_dir: Path | None = None
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL", "DRAFTDECK_DATABASE_URL")
    )
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("REDIS_URL", "DRAFTDECK_REDIS_URL")
    )
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    token: str | None = None
    host: str = "127.0.0.1"
    # Host names the web app answers to beyond localhost, 127.0.0.1, ::1 and the bind address (a page
    # on another site resolving its own name to this machine, DNS rebinding, is refused): comma
    # separated; ".example.com" admits it and its subdomains, "*" every name (app/web/auth.py)
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # what signs the forms' CSRF tokens; by default a random key kept in the home (<home>/secret), which
    # every process sharing the home reads
    secret: str | None = None
    port: int = 8000
    heartbeat_seconds: float = 5.0
    lost_after_seconds: float = 30.0
    sweep_seconds: float = 5.0
    # a failed chunked job's done chunks wait this long for a Retry to reuse them (app/run/resume.py)
    keep_failed_chunks_hours: float = Field(default=24.0, ge=0)
    # served drafters (app/serving/endpoints.py): an alert after this many failed scrapes in a row, and when
    # served tau is this share below the checkpoint's eval tau over at least this many drafts
    serving_alert_failures: int = Field(default=3, ge=1)
    serving_tau_drop: float = Field(default=0.10, gt=0, lt=1)
    serving_min_drafts: int = Field(default=1000, ge=1)

    @field_validator("data_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str):
            return [p for p in value.replace(",", ":").split(":") if p.strip()]
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return [h.strip().lower() for h in value.split(",") if h.strip()]
        return value

    @field_validator("database_url")
    @classmethod
    def _normalise_db(cls, value: str | None) -> str | None:
        if value and value.startswith(("postgres://", "postgresql://")):
            # SQLAlchemy's default PostgreSQL driver is psycopg2; we ship psycopg 3.
            return "postgresql+psycopg://" + value.split("://", 1)[1]
        return value

    @property
    def home_dir(self) -> Path:
        return self.home.resolve()

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home_dir / 'draftdeck.db'}"

    @property
    def roots(self) -> list[Path]:
        """Data roots, resolved. By default ./data (the user's files) and the home (outputs, datasets)."""
        if self.data_roots:
            return [Path(r).expanduser().resolve() for r in self.data_roots]
        return [(Path.cwd() / "data").resolve(), self.home_dir]

    @property
    def broker_url(self) -> str:
        # kombu's filesystem transport reads no host; naming one stops it warning on every connection
        return self.redis_url or "filesystem://localhost/"

    @property
    def broker_dir(self) -> Path:
        return self.home_dir / "broker"

    @property
    def jobs_dir(self) -> Path:
        return self.home_dir / "jobs"

    @property
    def embedded(self) -> bool:
        return self.redis_url is None

    def secret_key(self) -> bytes:
        """The key that signs CSRF tokens: DRAFTDECK_SECRET, else a random one made once in the home
        (readable by its owner only) and read by every process that shares the home."""
        return self.secret.encode() if self.secret else _home_secret(self.home_dir / "secret")

    def check_listen(self, host: str) -> None:
        """Refuse to listen beyond loopback without a token: anything there could launch work."""
        if not is_loopback(host) and not self.token:
            raise SystemExit(
                f"refusing to listen on {host} without DRAFTDECK_TOKEN: set a token, or listen on 127.0.0.1"
            )

    def ensure_dirs(self) -> None:
        for d in (self.home_dir, self.jobs_dir, self.broker_dir / "queue", self.broker_dir / "processed"):
            d.mkdir(parents=True, exist_ok=True)
        if not self.data_roots:  # the default ./data: created, so the first start has a place for files
            self.roots[0].mkdir(parents=True, exist_ok=True)


@lru_cache
def _home_secret(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # written whole under another name, then linked: a process never reads a half-written key, and when
    # two make one at once, the first link wins and both read it
    tmp = path.with_name(f".secret.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_hex(32).encode())
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_bytes()


@lru_cache
def get_settings() -> Settings:
    return Settings()
