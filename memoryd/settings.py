"""Typed settings: environment variables prefixed `MEMORYD_` (nested with `__`), or a TOML file.

Built once by the composition root and passed down; nothing else reads the environment.
Example: `MEMORYD_KAFKA__BOOTSTRAP_SERVERS=broker:9092`, `MEMORYD_LLM__BACKEND=gemini`.
Every model here, nested ones too, refuses a key it does not have: a mistyped setting
(`MEMORYD_POSTGRES__URL`) stops the process at start instead of leaving the default in force.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    SecretStr,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from consumers.settings import ProcessorSettings
from memoryd.ops.config import MaintenanceSettings, OpsSettings
from processors.cost import ModelPrice
from processors.llm.thinking import (
    DEFAULT_THINKING_BUDGET,
    check_thinking_budget,
    default_thinking_budget,
    most_thinking,
)
from producers.contract import Identifier
from store.embedding_models import FLOAT_PRODUCTS_MODEL, INTEGER_PRODUCTS_MODEL, ModelName
from store.read.background import WriterSettings
from store.service_urls import chroma_url


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str = "127.0.0.1:19092"
    topic: str = "context-events"
    dead_letter_topic: str = "context-events.dlq"
    partitions: int = Field(default=6, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    log_writer_group: str = "memoryd-log"
    processor_group: str = "memoryd-processor"
    delivery_timeout_ms: int = 30_000
    session_timeout_ms: int = 30_000
    max_poll_interval_ms: int = 300_000
    # Records the log writer takes per poll, and so per transaction and offset commit: both
    # cost the same for 500 records as for 5,000 (BENCHMARKS, Ingest). The processor keeps
    # kafka-python's 500: its batches are cut per memory anyway.
    log_writer_max_poll_records: int = Field(default=5_000, ge=1)
    # How long Kafka keeps records (`retention.ms` of both topics, set by `memoryd topics`).
    # An erased memory's events stay on the topics this long, unreachable to every consumer
    # (the erasure's cut-offs) but not deleted: see the README's erasure section.
    retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=3_600_000)
    # The largest record the producer sends (its max_request_size), at most the event topic's
    # `max.message.bytes` (1 MiB and a little by default). The producer refuses a larger event
    # itself, and that one alone: kafka-python's idempotent producer takes the broker's refusal
    # of a record as fatal, and fails every send after it (the publisher then replaces it, the
    # events caught up with that one failed). `memoryd topics` creates the topic with this limit.
    max_record_bytes: int = Field(default=1_048_576, ge=4096)


class PostgresSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dsn: str = "postgresql://postgres@127.0.0.1:15432/memoryd"
    pool_max_size: int = Field(default=12, ge=2)


class ChromaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["embedded", "http"] = "embedded"
    path: Path = Path(".memoryd/chroma")
    url: Annotated[str, AfterValidator(chroma_url)] = "http://127.0.0.1:18000"
    collection: str = "memory_facts"


# A call takes the wait for its first token (the prompt read, the provider's queue), then its
# output at the rate the model writes: Gemini 2.5 Flash some 150-250 tokens a second, Pro about
# 100. At 100, the largest answer the defaults allow (16,384 tokens of answer and 2,048 of
# thinking) takes 185 s, the call 215 s. A call cut by its timeout is paid for all the same and
# books nothing, nor do its retries, which fare alike: the timeout lets the largest allowed
# answer finish. Nothing else cuts a call shorter: the processor polls on while flushes run
# (kafka.max_poll_interval_ms does not bound them), an erasure waiting for the memory's lock
# is accepted (202) after api.erasure_lock_wait_s and finished by the processors once the
# flush is done, and a shutdown waits for the calls under way.
FIRST_TOKEN_S = 30
SLOWEST_TOKENS_PER_S = 100


def call_timeout_ms(answer_tokens: int, thinking_tokens: int) -> int:
    """The per-call timeout that lets an answer of this many tokens finish."""
    writing_s = math.ceil((answer_tokens + thinking_tokens) / SLOWEST_TOKENS_PER_S)
    return (FIRST_TOKEN_S + writing_s) * 1000


class LlmSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["offline", "gemini"] = "offline"
    model: str = "gemini-2.5-flash"
    api_key: SecretStr | None = None
    base_url: str | None = None
    # Unset: long enough for the largest answer the two below allow (`call_timeout_ms`).
    timeout_ms: int = Field(default=215_000, ge=100)
    # The room for the answer's text (see processors.llm.gemini.DEFAULT_MAX_OUTPUT_TOKENS).
    max_output_tokens: int = Field(default=16_384, ge=1)
    # On top of max_output_tokens, at most this many for the model's thinking (Gemini 2.5),
    # so thinking never takes the answer's room; the two together may not exceed the model's
    # 65,536 (the backend refuses to start). None leaves it to the model (one that takes no
    # thinking budget). Unset: by the model's family (processors.llm.thinking), 0 for one that
    # does not think unless asked (flash-lite).
    thinking_budget: int | None = Field(default=DEFAULT_THINKING_BUDGET, ge=0)

    @model_validator(mode="after")
    def _a_budget_the_model_takes(self) -> Self:
        if "thinking_budget" not in self.model_fields_set:
            self.thinking_budget = default_thinking_budget(self.model)
        # Found at start: the API refuses it with a 400, and every batch would be dead-lettered.
        check_thinking_budget(self.model, self.thinking_budget)
        if "timeout_ms" not in self.model_fields_set:
            thinking = most_thinking(self.model, self.thinking_budget)
            self.timeout_ms = call_timeout_ms(self.max_output_tokens, thinking)
        return self


class MetricsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    log_writer_port: int = 9400
    processor_port: int = 9401
    api_port: int = 9402
    enabled: bool = True
    # A process whose read path gave rows up as it stopped keeps its metrics port open this
    # long after its work ended, so that Prometheus scrapes the count (MemorydReadAuditDropped):
    # longer than the scrape interval.
    final_scrape_s: float = Field(default=20.0, ge=0)


class ReadPathSettings(BaseModel):
    """The read path: injection cache, background writers, optional query rewrite."""

    model_config = ConfigDict(extra="forbid")

    cache_max_users: int = Field(default=10_000, ge=1)
    # How long a memory's stamp read from Postgres is trusted without asking again while this
    # process hears every change announced (store.read.memory_changes); 0: ask on every turn.
    stamp_ttl_s: float = Field(default=30.0, ge=0)
    # Memories' fact vectors held for dense retrieval: 1 GiB is 700k facts of 384 dimensions.
    dense_cache_mb: int = Field(default=1024, ge=1)
    # How often an API process drops cached injections of memories erased elsewhere.
    cache_sweep_s: float = Field(default=30.0, gt=0)
    # The background writers of audit rows and recall counters.
    writer: WriterSettings = WriterSettings()
    rewrite: Literal["off", "gemini"] = "off"
    rewrite_model: str = "gemini-2.5-flash-lite"
    # How long a turn waits for its rewrite; past it the raw query is used.
    rewrite_timeout_ms: int = Field(default=300, ge=10)
    # How long the rewrite's HTTP call itself may take. A call the turn stopped waiting for
    # goes on, and is booked when it ends: cut at the turn's limit, it would have been paid
    # and never booked (an abandoned request has no usage to read).
    rewrite_call_timeout_ms: int = Field(default=5_000, ge=100)

    @model_validator(mode="after")
    def _a_rewrite_may_outlast_the_turn(self) -> Self:
        if self.rewrite_call_timeout_ms <= self.rewrite_timeout_ms:
            raise ValueError(
                f"read_path.rewrite_call_timeout_ms ({self.rewrite_call_timeout_ms}) must be"
                f" over rewrite_timeout_ms ({self.rewrite_timeout_ms}): a call cut at the"
                " turn's limit is paid but has no usage to book"
            )
        return self


# 500 events of 8,000-character fields fit with room to spare.
MAX_BODY_BYTES = 16 * 2**20


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8080
    # Worker processes sharing the port (see memoryd.api.serve): one per core measured best.
    workers: int = Field(default=2, ge=1)
    # Threads of each worker reading chat turns (`POST /v1/context`); more turns wait their turn.
    turn_threads: int = Field(default=2, ge=1)
    # Threads of each worker running erasures (the DELETE routes); more erasures wait their
    # turn. An erasure waits for its memory's lock, which a flush holds through its model
    # call: on the shared thread pool, a burst of them would leave no thread to other routes.
    erasure_threads: int = Field(default=2, ge=1)
    # Seconds an erasure waits for that lock before it is audited and answered 202, left open
    # for the processors to finish: a flush's model call can take minutes, longer than a
    # client should hang. Postgres grants a lock's waiters in turn, so the erasure waits out
    # the one flush that holds it (the memory's next flush queues behind it): most model calls
    # end within 30 s, and most erasures are answered with their receipt.
    erasure_lock_wait_s: float = Field(default=30.0, gt=0, le=300)
    # Each worker's cyclic GC thresholds (memoryd.ops.heap): young collections every 10,000 net
    # allocations instead of 700 promote far fewer turns in flight, so full collections are rare.
    gc_thresholds: tuple[PositiveInt, PositiveInt, PositiveInt] = (10_000, 20, 10)
    # sha256 (hex) of each bearer token -> the organization it acts for. Only digests are
    # configured, so neither the settings file nor the environment holds a usable secret. The
    # organization is an identifier like every other: ids derived from it join it with others.
    tokens: dict[str, Identifier] = Field(default_factory=dict)
    # A request body over this many bytes is refused (413) before it is parsed.
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=1024)


class ErasureSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The secret of the keyed digest that names an erased memory in the erasure audit and
    # the replay cut-offs. Every process of a deployment must use the same one; the default
    # is for development only.
    subject_key: SecretStr = SecretStr("memoryd-development-subject-key")
    actor: str = "memoryd"  # who the CLI records as having asked, unless --actor says


class DevSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: Path = Path(".memoryd")
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    postgres_port: int = 15432
    chroma_port: int = 18000


def default_prices() -> dict[str, ModelPrice]:
    # USD list prices per million tokens (prompts up to 200k tokens; a cached prompt token at
    # a tenth of an input one); override in settings when they change.
    return {
        "gemini-2.5-flash": ModelPrice(
            input_usd_per_mtok=0.30, output_usd_per_mtok=2.50, cached_input_usd_per_mtok=0.03
        ),
        "gemini-2.5-flash-lite": ModelPrice(
            input_usd_per_mtok=0.10, output_usd_per_mtok=0.40, cached_input_usd_per_mtok=0.01
        ),
        "gemini-2.5-pro": ModelPrice(
            input_usd_per_mtok=1.25, output_usd_per_mtok=10.0, cached_input_usd_per_mtok=0.125
        ),
        "offline-deterministic-v2": ModelPrice(),
        INTEGER_PRODUCTS_MODEL: ModelPrice(usd_per_1k_embeddings=0.0),
        FLOAT_PRODUCTS_MODEL: ModelPrice(usd_per_1k_embeddings=0.0),
    }


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _over_default_prices(given: dict[str, ModelPrice]) -> dict[str, ModelPrice]:
    return {**default_prices(), **given}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MEMORYD_",
        env_nested_delimiter="__",
        extra="forbid",
        toml_file=None,
        # An optional setting is unset from the environment as in JSON: THINKING_BUDGET=null.
        env_parse_none_str="null",
    )

    kafka: KafkaSettings = KafkaSettings()
    postgres: PostgresSettings = PostgresSettings()
    chroma: ChromaSettings = ChromaSettings()
    llm: LlmSettings = LlmSettings()
    processor: ProcessorSettings = ProcessorSettings()
    metrics: MetricsSettings = MetricsSettings()
    dev: DevSettings = DevSettings()
    read_path: ReadPathSettings = ReadPathSettings()
    api: ApiSettings = ApiSettings()
    erasure: ErasureSettings = ErasureSettings()
    # Added to the defaults (and replacing those of the same models): a deployment that
    # prices one more model keeps the prices of the ones it runs already.
    prices: Annotated[dict[str, ModelPrice], AfterValidator(_over_default_prices)] = Field(
        default_factory=default_prices
    )
    # Prices a model missing from `prices` (counted by memoryd_unpriced_model_uses_total);
    # without it, a model in use that has no price stops the process at start-up.
    default_price: ModelPrice | None = None
    ops: OpsSettings = OpsSettings()
    maintenance: MaintenanceSettings = MaintenanceSettings()
    # Which graph of the shipped model embeds (store.embeddings): a Chroma collection keeps the
    # one it was filled with, so a deployment whose collection has float-product vectors sets
    # "all-MiniLM-L6-v2-onnx-int8" (or indexes into a new collection).
    embedding_model: ModelName = INTEGER_PRODUCTS_MODEL
    # Cores one call of the embedding model may use (store.embeddings.MiniLmEmbedder); 0: one
    # per core. The float graph splits each model run over them, the integer graph runs that
    # many of a call's texts side by side.
    embedding_threads: int = Field(default=0, ge=0)
    log_level: Annotated[LogLevel, BeforeValidator(lambda v: str(v).upper())] = "INFO"
    # json: one JSON object a line, ids as fields (production); text: for a terminal.
    log_format: Literal["json", "text"] = "json"

    @model_validator(mode="after")
    def _a_key_for_gemini(self) -> Self:
        # Found at start, not when the first batch or turn builds the client.
        if self.llm.api_key is None and "gemini" in (self.llm.backend, self.read_path.rewrite):
            raise ValueError(
                "llm.backend=gemini and read_path.rewrite=gemini need MEMORYD_LLM__API_KEY"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment wins over the file, so one variable can override a shared config.
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls),
            file_secret_settings,
        )


def load_settings(config_file: Path | None = None) -> Settings:
    if config_file is None:
        return Settings()
    if not config_file.is_file():
        # pydantic-settings skips a TOML file that is not there: a mistyped path would run
        # on the defaults without a word.
        raise FileNotFoundError(f"no settings file {config_file}")

    class FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=config_file)

    return FileSettings()
