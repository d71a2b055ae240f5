"""kafka-python clients made so that a constructor that fails leaves nothing open behind it.

kafka-python 3.0.12's KafkaConsumer and KafkaAdminClient start their network client (an I/O
thread, its selector, a wake-up socket pair) and only then reach for a broker. When none answers,
the constructor raises and nothing ever closes that client: a thread and four descriptors stay
behind for each attempt, for as long as the process lives (a health check tries every few
seconds while Kafka is down). KafkaProducer's leaves its selector to the garbage collector.

Each of the three makes its network client with the factory of its `kafka_client` setting, so
open_client() passes one that keeps what it made, and closes that if the constructor raises.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kafka.errors import KafkaError


def open_client(client_class: Any, **configs: Any) -> Any:
    """client_class(**configs), for KafkaConsumer, KafkaProducer or KafkaAdminClient; if that
    raises, the network client it had made is closed before the error goes on to the caller."""
    make_network = configs.pop("kafka_client", client_class.DEFAULT_CONFIG["kafka_client"])
    made: list[Any] = []

    def network_client(**network_configs: Any) -> Any:
        made.append(make_network(**network_configs))
        return made[-1]

    try:
        return client_class(kafka_client=network_client, **configs)
    except BaseException:
        for network in made:
            # The constructor's own error is what the caller must see; a client that never
            # reached a broker has nothing to flush, so a failure to close it changes nothing.
            with contextlib.suppress(KafkaError, OSError):
                network.close()
        raise
