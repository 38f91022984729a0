"""Every setting, read from the environment (and ``.env``); ``.env.example`` documents each.

The defaults are the embedded mode: SQLite for the game, the broker and the results, all
under ``ANIMEGAMER_DATA_DIR``, and the shipped toy-world model on the CPU. Nothing here imports torch.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import quote, unquote, urlsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from relay.tls import with_database_ca, with_redis_tls

DUTY_SECONDS = 10.0  # the default of ANIMEGAMER_DUTY_SECONDS
WORKER_STALL_SECONDS = 300.0  # the default of ANIMEGAMER_WORKER_STALL_SECONDS, where the time limit allows it


class Settings(BaseSettings):
    # An empty value is an unset one: a copied .env.example (SHARD_COUNT=, DEV_GUILD=) means the defaults.
    model_config = SettingsConfigDict(env_prefix="ANIMEGAMER_", env_file=".env", extra="ignore", env_ignore_empty=True)

    data_dir: Path = Path("data")
    database_url: str = ""  # default: sqlite+aiosqlite:///<data_dir>/animegamer.db
    # auto: the bot migrates its embedded SQLite file at start, and only checks a server database (an operator runs
    # `animegamer db upgrade`); always: it migrates any (PostgreSQL under an advisory lock); never: it only checks.
    migrate_at_start: Literal["auto", "always", "never"] = "auto"
    broker_url: str = ""  # default: sqla+sqlite:///<data_dir>/broker.db; or redis://host:6379/0
    result_backend: str = ""  # default: db+sqlite:///<data_dir>/results.db; or redis://host:6379/1
    # Passwords as typed, for the Redis URLs (broker and results) and the database URL: each goes into its URLs
    # percent-encoded, so every character reaches the server as it is, "%41" included. (Written inside a URL, a
    # password is read as URLs are, by every client: "%41" there is "A".)
    redis_password: SecretStr | None = None
    database_password: SecretStr | None = None
    # TLS to Redis, for rediss:// URLs (relay/tls.py): the CA that signed the server's certificate (unset: the
    # system's), and a client certificate and key where the server asks for one. A rediss:// URL's certificate is
    # always verified unless its query says ssl_cert_reqs=none.
    redis_ca_file: Path | None = None
    redis_cert_file: Path | None = None
    redis_key_file: Path | None = None
    # TLS to PostgreSQL: the CA that signed its certificate; the database URL then asks for sslmode=verify-full
    # (the certificate and the host name checked) unless it names another mode. libpq's sslrootcert, sslcert and
    # sslkey may also be written in the URL itself (db/engine.py).
    database_ca_file: Path | None = None
    # Clips and representations over inline_max_bytes: unset, Redis keys beside the results when those are in
    # Redis (machines that share no folder), else <data_dir>/blobs; set, a folder every process mounts.
    blob_dir: Path | None = None
    inline_max_bytes: int = Field(default=8192, ge=0)
    queue: str = "turns"

    model: str = "toy"  # toy (trained, shipped) | tiny | full (random weights) | animegamer (the published files)
    # Where the bot keeps posted clips; default <data_dir>/clips. Bot processes of one game share it (a volume).
    clip_dir: Path | None = None
    # s3://bucket/prefix: clips and kept recaps in an S3-compatible store instead (bot/clip_store.py), reached with
    # the usual S3 variables below; bot processes of one game then share no folder.
    clip_store: str = Field(default="", pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,62}(/.*)?)?$")
    aws_endpoint_url: str = Field(default="", validation_alias="AWS_ENDPOINT_URL")  # "": AWS itself
    aws_access_key_id: str = Field(default="", validation_alias="AWS_ACCESS_KEY_ID")
    aws_secret_access_key: SecretStr | None = Field(default=None, validation_alias="AWS_SECRET_ACCESS_KEY")
    aws_default_region: str = Field(default="us-east-1", validation_alias="AWS_DEFAULT_REGION")
    # An https endpoint's CA, where no system CA signed its certificate (boto3's own variable, read here too so that
    # a .env file sets it as well as the environment).
    aws_ca_bundle: Path | None = Field(default=None, validation_alias="AWS_CA_BUNDLE")
    checkpoints: Path = Path("checkpoints")  # the release's layout, for model animegamer
    offload_mllm: Literal["auto", "on", "off"] = "auto"  # MLLM in host memory, on the GPU for its passes only
    offload_decoder: Literal["auto", "on", "off"] = "auto"  # decoders in host memory, on the GPU to denoise
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_steps: int = Field(default=0, ge=0, le=1000)  # 0: the model's own (50)
    # Steps whose CFG weight is within this of 1 run only the conditional half (worker/pipeline/config.py); 0: both
    # halves at every step, as released. 0.001 (the default) skips 20 of 50 steps' halves, 18% of a published turn's
    # FLOPs (benchmarks/turn_flops.py): the half it drops moves v by under 0.1% of the guidance term, below bf16's
    # rounding, and it kept every frame of the tiny model.
    skip_unconditional_below: float = Field(default=0.001, ge=0.0, le=1.0)
    # A step whose first decoder block's residual changed by less than this fraction reuses the other blocks' work
    # from the last step that ran them (worker/pipeline/step_cache.py); 0: every block at every step, as released.
    # Off by default: the SDE sampler's fresh noise moves every step's input by about 0.2 (measured on the toy
    # model), so there is no quiet stretch to reuse and 0.25 already breaks clips (benchmarks/compute_cuts.py).
    step_cache_below: float = Field(default=0.0, ge=0.0, le=1.0)
    history_window: int = Field(default=1, ge=1, le=5)  # 1 = no past turns (README: why, for the toy model too)

    task_time_limit: int = Field(default=1800, ge=10)  # seconds one turn may take on a worker
    visibility_timeout: int = Field(default=0, ge=0)  # 0: task_time_limit + 60; redelivery after a lost worker
    broker_timeout: float = Field(default=3.0, gt=0)  # seconds to wait for a broker before saying so
    # A bot process's hold on a duty it does for the fleet (the outbox, a shard's posts) lasts this long: renewed every
    # third of it while the duty's loop finishes its rounds and Discord answers, given up once either has been stuck
    # for two thirds of it (bot/leases.py). A killed process's duties move within this and a third of it.
    duty_seconds: float = Field(default=DUTY_SECONDS, ge=3.0)
    discord_timeout: float = Field(
        default=5.0, gt=0
    )  # seconds one Discord REST call may take; at most duty_seconds / 2
    # Stuck this long (the event loop blocked, a duty's round unfinished, Discord silent), a bot fails /livez and its
    # orchestrator restarts it (bot/liveness.py); longer than the renew deadline, so its duties have moved by then.
    liveness_seconds: float = Field(default=20.0, gt=0)
    # A running turn's worker renews its claim on the turn every third of this; unseen this long, it is gone.
    # (ANIMEGAMER_LEASE_SECONDS, its earlier name, is still read.)
    claim_seconds: float = Field(
        default=30.0, ge=1.0, validation_alias=AliasChoices("ANIMEGAMER_CLAIM_SECONDS", "ANIMEGAMER_LEASE_SECONDS")
    )
    # A worker's turn that reports no step for this long is stuck (a GPU call that never returns): its claim is no
    # longer renewed, so another worker takes the turn, and the worker's /livez fails (worker/liveness.py). Longer
    # than the slowest silent stage (a published checkpoint's VAE decode), shorter than ANIMEGAMER_TASK_TIME_LIMIT.
    # 0: half the time limit, at most WORKER_STALL_SECONDS.
    worker_stall_seconds: float = Field(default=0.0, ge=0.0)
    pickup_timeout: float = Field(default=0.0, ge=0)  # seconds a turn waits for a worker; 0: 3x its ETA, >= 2 min
    db_busy_timeout: float = Field(default=5.0, gt=0)  # seconds a SQLite write waits for another writer
    fair_queue: bool = True  # each server gets its share of the workers (game.schedule); false: first come first served

    # The Discord bot.
    discord_token: SecretStr | None = Field(default=None, validation_alias="DISCORD_TOKEN")
    discord_api_base: str = Field(default="", validation_alias="DISCORD_API_BASE")  # a REST proxy, e.g. .../api/v10
    discord_gateway_url: str = Field(default="", validation_alias="DISCORD_GATEWAY_URL")  # a gateway proxy (ws://)
    shard_count: int | None = Field(default=None, ge=1, validation_alias="SHARD_COUNT")  # None: Discord's advice
    # The shards this process connects ("0-3" or "0,2,4"; needs SHARD_COUNT); None: all of them. A fleet splits
    # SHARD_COUNT's shards between its processes.
    shard_ids: Annotated[list[int] | None, NoDecode] = Field(default=None, validation_alias="SHARD_IDS")
    dev_guild: int | None = Field(default=None, validation_alias="DEV_GUILD")  # sync commands to this guild only
    characters: list[str] = ["Qiqi", "Sosuke"]  # /start offers these; animegamer workers load each one's pair
    delivery_poll_seconds: float = Field(default=1.0, gt=0)  # how often the bot checks jobs in flight
    delivery_concurrency: int = Field(default=8, ge=1)  # clips posted at once (each story's in order)
    progress_edit_seconds: float = Field(default=3.0, ge=1.0)  # at most one edit per progress message this often
    upload_limit_bytes: int = Field(default=0, ge=0)  # 0: the server's own limit; clips above are re-encoded smaller
    stop_seconds: float = Field(default=30.0, gt=0)  # on SIGTERM the bot closes within this, then exits 0
    recap_cooldown_seconds: float = Field(default=300.0, ge=0)  # least time between two /story recap of one story
    # Retention (db.retention): each character's and story's newest 5 turns keep both, whatever their age.
    clip_retention_days: int = Field(default=30, ge=0)  # older turns' clip files are deleted; 0: kept forever
    # The nudity score (0..1) that flags a clip, for servers that set none with /admin safety (game/safety.py says
    # how the default was measured).
    safety_threshold: float = Field(default=0.5, gt=0.0, le=1.0)
    # The highest threshold a server may choose: at 1.0 nothing is ever flagged, even under "withhold".
    safety_threshold_max: float = Field(default=0.9, gt=0.0, le=1.0)
    representation_retention_days: int = Field(default=7, ge=0)  # older turns' representations too; 0: forever
    retention_interval_seconds: float = Field(default=3600.0, gt=0)  # how often the bot applies them

    # Watching it: Prometheus /metrics endpoints (README, "Watching it"); 0 = off.
    metrics_port: int = Field(default=0, ge=0, le=65535)  # the bot's
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)  # a worker's; one port per worker on a machine
    metrics_address: str = "127.0.0.1"  # where both listen; 0.0.0.0 opens them to the network

    @field_validator("shard_ids", mode="before")
    @classmethod
    def _shard_ranges(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        ids: list[int] = []
        for part in value.replace(" ", "").split(","):
            first, _, last = part.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                raise ValueError(f"SHARD_IDS={value!r}: write shard numbers and ranges, like 0-3 or 0,2,4")
            ids += range(int(first), int(last or first) + 1)
        return sorted(set(ids))

    @model_validator(mode="after")
    def _shards_within_count(self) -> Settings:
        if self.shard_ids is not None:
            if self.shard_count is None:
                raise ValueError("SHARD_IDS needs SHARD_COUNT: the fleet's shard total, the same in every process")
            if not self.shard_ids or max(self.shard_ids) >= self.shard_count:
                raise ValueError(f"SHARD_IDS must name shards 0 to {self.shard_count - 1} (SHARD_COUNT)")
        return self

    def model_post_init(self, _context: object) -> None:
        data = self.data_dir.as_posix()
        self.database_url = encoded_secret(self.database_url) or f"sqlite+aiosqlite:///{data}/animegamer.db"
        self.broker_url = encoded_secret(self.broker_url) or f"sqla+sqlite:///{data}/broker.db"
        self.result_backend = encoded_secret(self.result_backend) or f"db+sqlite:///{data}/results.db"
        if self.redis_password is not None:
            typed = self.redis_password.get_secret_value()
            self.broker_url = with_password(self.broker_url, typed, REDIS_SCHEMES)
            self.result_backend = with_password(self.result_backend, typed, REDIS_SCHEMES)
        if self.database_password is not None:
            self.database_url = with_password(self.database_url, self.database_password.get_secret_value())
        if self.database_ca_file is not None:
            self.database_url = with_database_ca(self.database_url, self.database_ca_file)
        tls = (self.redis_ca_file, self.redis_cert_file, self.redis_key_file)
        self.broker_url = with_redis_tls(self.broker_url, *tls)
        self.result_backend = with_redis_tls(self.result_backend, *tls)
        if self.blob_dir == Path():  # left empty, as in .env.example
            self.blob_dir = None
        if self.blob_dir is None and not self.results_in_redis:
            self.blob_dir = self.data_dir / "blobs"
        self.visibility_timeout = self.visibility_timeout or self.task_time_limit + 60
        self.worker_stall_seconds = self.worker_stall_seconds or min(WORKER_STALL_SECONDS, self.task_time_limit / 2)

    @property
    def results_in_redis(self) -> bool:
        return self.result_backend.startswith(("redis://", "rediss://", "unix://"))


def encoded_secret(url: str) -> str:
    """The URL with its user name and password percent-encoded, whatever characters they hold.

    A password made by ``openssl rand -base64 32`` holds ``/``, ``+`` and ``=`` about half the time, and put into a
    URL as it is (by hand, or by compose's ``${POSTGRES_PASSWORD}``) it cuts the URL short: every parser then reads
    part of the secret as the port or the path, and says so in its error. The credentials end at the URL's last
    ``@``, so they are re-encoded from there; ones already encoded come out the same.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, place = rest.rpartition("@")
    user, colon, password = credentials.partition(":")
    return f"{scheme}://{quote(unquote(user), safe='')}{colon}{quote(unquote(password), safe='')}@{place}"


REDIS_SCHEMES = ("redis://", "rediss://")


def with_password(url: str, password: str, schemes: tuple[str, ...] | None = None) -> str:
    """``url`` with ``password`` in it as typed: percent-encoded whole, never decoded first. A URL of another
    scheme than ``schemes`` (the embedded SQLite queue's, say) is left as it is."""
    scheme, sep, rest = url.partition("://")
    if not sep or (schemes is not None and not url.startswith(schemes)) or rest.startswith("/"):
        return url
    credentials, at, place = rest.rpartition("@")
    user = credentials.partition(":")[0] if at else ""
    return f"{scheme}://{user}:{quote(password, safe='')}@{place}"


def variable_of(field: str) -> str:
    """The environment variable a setting is read from (for one renamed, its name now)."""
    info = Settings.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        alias = alias.choices[0]
    return str(alias or info.alias or f"ANIMEGAMER_{field.upper()}")


def settings_at_odds(settings: Settings) -> str | None:
    """One line naming two settings that cannot work together, and why; None when none are at odds.

    Each is a combination that fails silently at run time: a broker timeout as long as the outbox's hold means the
    holder is never sure it can send (nothing is ever sent, and nothing says why), a Discord call longer than half
    the hold outlives it, a visibility timeout shorter than a turn hands a running turn to a second worker.
    """
    hold = settings.duty_seconds
    rules = [
        (
            settings.broker_timeout <= hold / 2,
            f"ANIMEGAMER_BROKER_TIMEOUT ({settings.broker_timeout:g} s) must be at most half of "
            f"ANIMEGAMER_DUTY_SECONDS ({hold:g} s): the outbox sends only while its hold outlasts a send, so it would "
            "never send",
        ),
        (
            settings.discord_timeout <= hold / 2,
            f"ANIMEGAMER_DISCORD_TIMEOUT ({settings.discord_timeout:g} s) must be at most half of "
            f"ANIMEGAMER_DUTY_SECONDS ({hold:g} s): a Discord call would outlive the hold it is made under",
        ),
        (
            settings.delivery_poll_seconds < hold / 3,
            f"ANIMEGAMER_DELIVERY_POLL_SECONDS ({settings.delivery_poll_seconds:g} s) must be under a third of "
            f"ANIMEGAMER_DUTY_SECONDS ({hold:g} s): the duties' holds are renewed only between the loop's rounds",
        ),
        (
            settings.liveness_seconds > hold * 2 / 3,
            f"ANIMEGAMER_LIVENESS_SECONDS ({settings.liveness_seconds:g} s) must be over two thirds of "
            f"ANIMEGAMER_DUTY_SECONDS ({hold:g} s): a stuck process gives its duties up before it is restarted",
        ),
        (
            settings.safety_threshold <= settings.safety_threshold_max,
            f"ANIMEGAMER_SAFETY_THRESHOLD ({settings.safety_threshold:g}) must be at most "
            f"ANIMEGAMER_SAFETY_THRESHOLD_MAX ({settings.safety_threshold_max:g}): the cap every server's threshold "
            "is held to",
        ),
        (
            settings.worker_stall_seconds < settings.task_time_limit,
            f"ANIMEGAMER_WORKER_STALL_SECONDS ({settings.worker_stall_seconds:g} s) must be under "
            f"ANIMEGAMER_TASK_TIME_LIMIT ({settings.task_time_limit} s): the time limit would end a stuck turn first",
        ),
        (
            settings.redis_ca_file is None or settings.broker_url.startswith("rediss://"),
            "ANIMEGAMER_REDIS_CA_FILE is set, but ANIMEGAMER_BROKER_URL is not rediss://: the queue would travel in "
            "plain text",
        ),
    ]
    return next((said for holds, said in rules if not holds), None)


URL_SETTINGS = {
    "database_url": "ANIMEGAMER_DATABASE_URL",
    "broker_url": "ANIMEGAMER_BROKER_URL",
    "result_backend": "ANIMEGAMER_RESULT_BACKEND",
}


def unreadable_url(settings: Settings) -> str | None:
    """One line naming the first URL setting that no client can read, and what to do; None when all read.

    Said before any command starts, in place of the traceback a client library would print a few calls later,
    which quotes part of the URL (the password, when a reserved character in it cut the URL short). The line
    names the setting only, never its value.
    """
    from sqlalchemy.engine import make_url

    for field, variable in URL_SETTINGS.items():
        url = getattr(settings, field)
        try:
            if field == "database_url":
                make_url(url)
            else:
                parts = urlsplit(url)
                parts.port  # noqa: B018 - raises on a port that is no number, or out of range
            if "://" not in url:
                raise ValueError("no scheme")
        except Exception:
            return (
                f"{variable} cannot be read as a URL: check its scheme, host and port, and percent-encode any "
                "reserved character in its user name or password (/ # ? @ : % and spaces)."
            )
    return None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
