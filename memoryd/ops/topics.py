"""The event and dead-letter topics: created when missing, with the configured retention.

Retention is set explicitly, never left to the broker's default: it is how long an erased
memory's records stay on Kafka (unreachable, see the README's erasure section). A topic this
call creates gets it at creation; a topic that exists already gets it by an AlterConfigs
request, and every answer to that request is checked: a refusal (authorization, a topic the
broker does not describe yet) stops the caller instead of leaving the broker's retention.

The event topic is created with `max.message.bytes` from the producer's own limit, so that the
broker never refuses a record the producer let through (see KafkaSettings.max_record_bytes). On
a topic that exists, a lower value is reported, not changed: raising a topic's limit is the
operator's decision (it bounds what every consumer must fetch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from domain.retry import Backoff
from memoryd.settings import Settings
from producers.kafka_clients import open_client

log = logging.getLogger(__name__)

# A topic just created by another process can be listed before every broker describes it:
# its configuration is retried for this long.
ALTER_PATIENCE_S = 15.0
_BACKOFF = Backoff(base_s=0.05, max_s=1.0)


class TopicConfigError(Exception):
    """The broker did not take a topic's configuration."""


def ensure_topics(settings: Settings) -> list[str]:
    """Create the event and dead-letter topics if missing (broker auto-creation is off), and
    give both the configured `retention.ms`, also when they exist already. Returns a note for
    an event topic found refusing records the producer sends, which it leaves as is."""
    k = settings.kafka
    configs = {"retention.ms": str(k.retention_ms)}
    record_limit = {"max.message.bytes": str(k.max_record_bytes)}
    names = [k.topic, k.dead_letter_topic]
    admin = open_client(
        KafkaAdminClient, bootstrap_servers=k.bootstrap_servers, client_id="memoryd-admin"
    )
    try:
        existing = set(admin.list_topics())
        missing = [n for n in names if n not in existing]
        to_alter = [n for n in names if n in existing]
        if missing:
            new = [
                NewTopic(
                    n,
                    k.partitions,
                    k.replication_factor,
                    topic_configs=configs | record_limit if n == k.topic else configs,
                )
                for n in missing
            ]
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                # Another process created some of them meanwhile, perhaps with other settings.
                log.info("topics were created concurrently")
                to_alter = names
        if to_alter:
            _alter(admin, to_alter, configs, time.sleep)
        if k.topic in to_alter:
            return _below(admin, k.topic, k.max_record_bytes)
        return []
    finally:
        admin.close()


def _below(admin: KafkaAdminClient, topic: str, record_limit: int) -> list[str]:
    """A note if the topic found takes smaller records than the producer sends. A larger limit
    agrees with the producer as well: the broker's default (1 MiB and 12 bytes) is one."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic)
    # "all": a value the topic takes from the broker's default is left out of "modified" ones.
    found = admin.describe_configs([resource], config_filter="all")["topic"][topic]
    has = int(found["max.message.bytes"]["value"])
    if has >= record_limit:
        return []
    note = (
        f"topic {topic} has max.message.bytes={has}, below the producer's limit of "
        f"{record_limit} (kafka.max_record_bytes): the broker refuses the records in between; "
        "left as is"
    )
    log.warning("%s", note)
    return [note]


def _alter(
    admin: KafkaAdminClient,
    names: Sequence[str],
    configs: dict[str, str],
    sleep: Callable[[float], None],
) -> None:
    resources = [ConfigResource(ConfigResourceType.TOPIC, n, configs=configs) for n in names]
    deadline = time.monotonic() + ALTER_PATIENCE_S
    attempt = 0
    while True:
        # raise_on_unknown=False: kafka-python would refuse before asking, with a ValueError,
        # when the answering broker does not describe the topic yet; the broker's own answer
        # says why, and is checked below.
        answers = admin.alter_configs(resources, raise_on_unknown=False).get("topic", {})
        refused = {n: answers.get(n, "no answer") for n in names if answers.get(n) != "OK"}
        if not refused:
            return
        if time.monotonic() >= deadline:
            raise TopicConfigError(f"the broker refused {configs} for topics: {refused}")
        log.info("topic configuration not taken yet, retrying: %s", refused)
        sleep(_BACKOFF.delay(attempt))
        attempt += 1
