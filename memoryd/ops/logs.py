"""Logging: one JSON object a line (production), or text for a terminal.

Ids travel as fields, never inside the message: `log.info("flush failed", extra={"user_id":
u, "organization_id": o})`, so a log pipeline can filter one user's or one run's lines
without parsing prose. The text format prints those fields after the message.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

from pythonjsonlogger.json import JsonFormatter

# The fields memoryd attaches with extra=; the text format shows them, JSON has all extras.
ID_FIELDS = (
    "organization_id",
    "user_id",
    "run_id",
    "event_id",
    "fact_id",
    "cluster_job",
    "consumer",
    "stage",
    "partition",
    "offset",
)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextWithIds(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = [
            f"{k}={getattr(record, k)}" for k in ID_FIELDS if getattr(record, k, None) is not None
        ]
        return f"{line} [{' '.join(ids)}]" if ids else line


def json_formatter() -> logging.Formatter:
    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        json_default=str,  # uuids, datetimes
    )


def configure_logging(level: str, fmt: Literal["json", "text"]) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(json_formatter() if fmt == "json" else TextWithIds(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # kafka-python and httpx (under chromadb) log every connection at INFO; keep their warnings.
    for noisy in ("kafka", "httpx"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
