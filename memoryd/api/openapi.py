"""The API's OpenAPI document, as committed in infra/openapi.json for other languages."""

from __future__ import annotations

import json
from pathlib import Path

from memoryd.api.app import create_app

COMMITTED = Path(__file__).resolve().parents[2] / "infra" / "openapi.json"


def openapi_json() -> str:
    """The document FastAPI serves at /openapi.json, in a stable, diff-friendly form."""
    return json.dumps(create_app(None).openapi(), indent=2, sort_keys=True) + "\n"


def write_openapi(path: Path = COMMITTED) -> None:
    path.write_text(openapi_json())
