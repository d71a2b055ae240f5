"""Real local Kafka, Postgres and Chroma without Docker, for `memoryd dev up/down` and tests.

Each service is a plain child process on 127.0.0.1 with its state in a home directory:
Kafka from Maven-fetched jars (infra/kafka/pom.xml), Postgres from the distribution's binaries,
Chroma from the `chroma` command of the chromadb wheel. Importing this package starts nothing.
"""

from memoryd.dev._process import PortTaken, ServiceError
from memoryd.dev.chroma import LocalChroma
from memoryd.dev.kafka import LocalKafka
from memoryd.dev.postgres import LocalPostgres
from memoryd.dev.stack import DevEndpoints, DevPorts, DevStack, default_cache_dir, free_port

__all__ = [
    "DevEndpoints",
    "DevPorts",
    "DevStack",
    "LocalChroma",
    "LocalKafka",
    "LocalPostgres",
    "PortTaken",
    "ServiceError",
    "default_cache_dir",
    "free_port",
]
