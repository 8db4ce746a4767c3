"""SQL tables (SQLModel). Alembic migrations in migrations/ create and change them."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Index, Integer, MetaData, UniqueConstraint
from sqlmodel import Field, SQLModel

# Named constraints so that migrations on SQLite (batch mode) and PostgreSQL stay in step.
SQLModel.metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class ChunkStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    LOST = "lost"  # its worker died in it twice, or no live worker was left to run it again


def _big(nullable: bool = False) -> Any:
    """A 64-bit count: inputs of 2 GiB and more overflow PostgreSQL's 32-bit INTEGER."""
    return Field(default=None if nullable else 0, sa_type=BigInteger, nullable=nullable)


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_heartbeat", "status", "heartbeat_at"),
        # One retry per attempt: a second retry of the same failed job is refused by the database too.
        UniqueConstraint("retry_of"),
    )

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(index=True)
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    status: str = Field(default=JobStatus.QUEUED, index=True)
    progress_done: int = _big()
    progress_total: int | None = _big(nullable=True)
    progress_unit: str = "rows"
    created_at: datetime = Field(default_factory=utcnow, index=True)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    worker: str | None = None
    task_id: str | None = None
    sent_at: datetime | None = None  # when its message was last sent: the sweeper re-sends lost ones
    queue: str = "cpu"
    error: str | None = None
    cancel_requested: bool = False
    attempt: int = 1
    retry_of: int | None = Field(default=None, foreign_key="jobs.id")
    result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # A run launched outside the job system that reports to it (app/run/external.py): the key its
    # reporter keeps in the run folder, and the last report item applied (items apply once, in order).
    external_key: str | None = Field(default=None, index=True)
    report_seq: int | None = _big(nullable=True)


class JobEvent(SQLModel, table=True):
    __tablename__ = "job_events"

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", index=True)
    at: datetime = Field(default_factory=utcnow)
    level: str = "info"  # info | warning | rejected | error
    code: str | None = None
    message: str = ""
    count: int = Field(default=1, sa_type=BigInteger)
    examples: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))


class JobOutput(SQLModel, table=True):
    __tablename__ = "job_outputs"
    __table_args__ = (UniqueConstraint("job_id", "path"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", index=True)
    path: str
    rows: int = _big()
    bytes: int = _big()
    sha256: str
    created_at: datetime = Field(default_factory=utcnow)


class MetricValue(SQLModel, table=True):
    """One metric point of a job's series. NaN/inf are kept as `flag` with `value` NULL, because
    PostgreSQL and SQLite disagree on storing them (app/store/metrics.py)."""

    __tablename__ = "metric_points"
    __table_args__ = (Index("ix_metric_points_job_name_step", "job_id", "name", "step"),)

    # 64-bit on PostgreSQL; SQLite's INTEGER PRIMARY KEY (its rowid) is 64-bit already.
    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer(), "sqlite")
    )
    job_id: int = Field(foreign_key="jobs.id")
    name: str
    step: int = Field(sa_type=BigInteger)
    tokens: int | None = Field(default=None, sa_type=BigInteger)
    # epoch milliseconds: an integer x, so bucket arithmetic is integer division on both databases
    wall_ms: int = Field(default_factory=lambda: int(utcnow().timestamp() * 1000), sa_type=BigInteger)
    value: float | None = None
    flag: int = 0  # 0 finite | 1 nan | 2 +inf | 3 -inf


class MetricSeries(SQLModel, table=True):
    """The summary of one (job, name) series, updated in the transaction that writes its points."""

    __tablename__ = "metric_series"

    job_id: int = Field(foreign_key="jobs.id", primary_key=True)
    name: str = Field(primary_key=True)
    count: int = 0
    nonfinite: int = 0
    first_step: int | None = None
    first_value: float | None = None
    last_step: int | None = None
    last_value: float | None = None
    last_flag: int = 0
    last_tokens: int | None = Field(default=None, sa_type=BigInteger)
    last_wall_ms: int | None = Field(default=None, sa_type=BigInteger)
    min_value: float | None = None
    max_value: float | None = None
    last_id: int = Field(default=0, sa_type=BigInteger)  # the newest point's id: where a live stream starts


class MetricRollup(SQLModel, table=True):
    """Per series, level L >= 1 groups steps [idx * 8**L, (idx + 1) * 8**L): min, max, sum, count and
    the last point, so a chart query reads at most a few thousand rows whatever the series' length."""

    __tablename__ = "metric_rollups"

    job_id: int = Field(foreign_key="jobs.id", primary_key=True)
    name: str = Field(primary_key=True)
    level: int = Field(primary_key=True)
    idx: int = Field(primary_key=True, sa_type=BigInteger)
    n: int = 0  # finite points
    nonfinite: int = 0
    vmin: float | None = None
    vmax: float | None = None
    vsum: float = 0.0
    last_step: int = 0
    last_value: float | None = None
    last_tokens: int | None = Field(default=None, sa_type=BigInteger)
    last_wall_ms: int = Field(default=0, sa_type=BigInteger)


class MetricStep(SQLModel, table=True):
    """Per job and step, the tokens seen and the wall time when it was first written: turns an x range
    in tokens or time into a step range."""

    __tablename__ = "metric_steps"
    __table_args__ = (
        Index("ix_metric_steps_job_tokens", "job_id", "tokens"),
        Index("ix_metric_steps_job_wall", "job_id", "wall_ms"),
    )

    job_id: int = Field(foreign_key="jobs.id", primary_key=True)
    step: int = Field(primary_key=True)
    tokens: int | None = Field(default=None, sa_type=BigInteger)
    wall_ms: int = Field(sa_type=BigInteger)


class Alert(SQLModel, table=True):
    __tablename__ = "alerts"

    id: int | None = Field(default=None, primary_key=True)
    job_id: int | None = Field(default=None, foreign_key="jobs.id", index=True)
    dataset: str | None = None
    endpoint_id: int | None = Field(default=None, foreign_key="serving_endpoints.id", index=True)
    kind: str  # empty_output | worker_lost | job_failed | zero_byte_shard | ...
    message: str
    created_at: datetime = Field(default_factory=utcnow, index=True)
    acknowledged: bool = Field(default=False, index=True)
    acknowledged_at: datetime | None = None


class Dataset(SQLModel, table=True):
    """A tokenized dataset directory the pages browse: made by a job, or registered by path."""

    __tablename__ = "datasets"

    id: int | None = Field(default=None, primary_key=True)
    path: str = Field(unique=True)
    name: str
    job_id: int | None = Field(default=None, foreign_key="jobs.id", index=True)
    origin: str = "registered"  # registered | job
    created_at: datetime = Field(default_factory=utcnow)


class JobChunk(SQLModel, table=True):
    """One chunk of a job split into tasks (tokenize): its own task, its own shard; see app/run/chunks.py."""

    __tablename__ = "job_chunks"
    __table_args__ = (
        UniqueConstraint("job_id", "chunk_index"),
        Index("ix_job_chunks_job_status", "job_id", "status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id")
    chunk_index: int
    status: str = ChunkStatus.PENDING
    input_path: str = ""
    conversations: int = _big()
    rows_in: int | None = _big(nullable=True)
    rows_out: int | None = _big(nullable=True)
    report: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    shard_path: str | None = None
    bytes: int | None = _big(nullable=True)
    sha256: str | None = None
    worker: str | None = None
    task_id: str | None = None
    error: str | None = None
    finalized_by: str | None = None  # set once, on chunk 0, by the task that runs the final step
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None  # beaten while the chunk runs: a dead worker stops it
    sent_at: datetime | None = None  # when its message was last sent: the sweeper re-sends lost ones
    losses: int = 0  # times its worker died in it; it runs again once
    # sha256 of what decides the chunk's shard (its input file, the tokenizer's files, the options):
    # a retry reuses a done chunk of the failed attempt only when this matches (app/run/resume.py)
    input_sha256: str | None = None
    reused_from: int | None = None  # the failed attempt whose done chunk this one took over


class Worker(SQLModel, table=True):
    """A live worker process (its Celery node) and the queues it serves, beaten by the worker itself:
    the sweeper and the job page tell from it whether anyone serves a job's queue."""

    __tablename__ = "workers"

    name: str = Field(primary_key=True)
    queues: str = ""  # comma-separated
    started_at: datetime = Field(default_factory=utcnow)
    heartbeat_at: datetime = Field(default_factory=utcnow)


class JobStateHistory(SQLModel, table=True):
    """Every accepted status change of a job (chunk_index NULL) or of one of its chunks, written in
    the transaction that made it (app/store/state.py)."""

    __tablename__ = "job_state_history"
    __table_args__ = (Index("ix_job_state_history_job_at", "job_id", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id")
    chunk_index: int | None = None
    from_status: str
    to_status: str
    reason: str = ""
    at: datetime = Field(default_factory=utcnow)


class ServingEndpoint(SQLModel, table=True):
    """A served drafter DraftDeck scrapes (app/serving/scraper.py): where its /metrics is, what it serves (a
    train run, a checkpoint or export folder), and its health as of the last scrape."""

    __tablename__ = "serving_endpoints"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    kind: str  # vllm | sglang
    base_url: str
    metrics_url: str
    drafter: str | None = None  # the checkpoint or exported folder it serves
    run_job_id: int | None = Field(default=None, foreign_key="jobs.id", index=True)
    token_env: str | None = None  # the environment variable holding its bearer token (never the token)
    model_name: str | None = None  # the served model whose counts are the drafter's (None: all, summed)
    interval_s: float = 15.0
    enabled: bool = True
    created_at: datetime = Field(default_factory=utcnow)
    next_scrape_at: datetime = Field(default_factory=utcnow, index=True)  # the scrapers' compare-and-set
    last_scrape_at: datetime | None = None
    last_ok_at: datetime | None = None
    last_error: str | None = None
    failures: int = 0  # consecutive failed scrapes
    last_raw: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class ServingWindow(SQLModel, table=True):
    """What one scrape added over the one before, per model_name: counter deltas summed over engines
    (vLLM), or SGLang's gauges as it reported them. Counts, so any range sums to a window."""

    __tablename__ = "serving_windows"
    __table_args__ = (Index("ix_serving_windows_endpoint_wall", "endpoint_id", "wall_ms"),)

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer(), "sqlite")
    )
    endpoint_id: int = Field(foreign_key="serving_endpoints.id")
    wall_ms: int = Field(sa_type=BigInteger)  # the later scrape's time, epoch milliseconds
    model_name: str = ""
    seconds: float = 0.0
    engines: int = 0
    restarted: int = 0
    drafts: int = _big()
    draft_tokens: int = _big()
    accepted: int = _big()
    per_position: list[int | None] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    gauges: dict[str, float] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    raw: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class ServingHour(SQLModel, table=True):
    """Per endpoint, model and hour of scrapes, the sum of its windows (app/serving/endpoints.py keeps
    it as each scrape lands): served tau over months reads hours, not every window (app/serving/series.py).
    `vmin`/`vmax`/`vlast` are the figure a window shows: its tau incl. bonus (vLLM), its accept length
    gauge (SGLang)."""

    __tablename__ = "serving_hours"

    endpoint_id: int = Field(foreign_key="serving_endpoints.id", primary_key=True)
    model_name: str = Field(default="", primary_key=True)
    hour: int = Field(primary_key=True, sa_type=BigInteger)  # wall_ms // 3,600,000
    windows: int = 0
    drafts: int = _big()
    draft_tokens: int = _big()
    accepted: int = _big()
    per_position: list[int | None] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    vmin: float | None = None
    vmax: float | None = None
    vlast: float | None = None
    last_wall_ms: int = Field(default=0, sa_type=BigInteger)
