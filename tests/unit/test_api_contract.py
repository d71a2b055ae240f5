"""The API's published contract: the committed OpenAPI document, and token handling."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from domain.erasure import REDACTED_JSON, REDACTION
from domain.ids import NO_CONNECTION
from memoryd.api.auth import TokenTable, hash_token
from memoryd.api.models import ContextRequest, CorrectionRequest, EventsRequest
from memoryd.api.openapi import COMMITTED, openapi_json
from memoryd.api.pages import cursor_of, position
from producers.contract import RESERVED_CONNECTION_IDS, Source, SourceMetadata
from tests.support.builders import make_event, make_fact


def test_committed_openapi_document_is_current() -> None:
    assert COMMITTED.read_text() == openapi_json(), (
        "infra/openapi.json is stale: run `memoryd api --openapi infra/openapi.json`"
    )


def test_openapi_lists_every_route_with_bearer_auth() -> None:
    spec = json.loads(openapi_json())
    assert set(spec["paths"]) == {
        "/healthz",
        "/readyz",
        "/v1/context",
        "/v1/events",
        "/v1/users/{user_id}",
        "/v1/users/{user_id}/memory",
        "/v1/users/{user_id}/facts/{fact_id}",
        "/v1/users/{user_id}/facts/{fact_id}/correction",
    }
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_token_table() -> None:
    table = TokenTable({hash_token("s3cret"): "org-a", hash_token("other"): "org-b"})
    assert table.organization("s3cret") == "org-a"
    assert table.organization("other") == "org-b"
    assert table.organization("S3cret") is None
    assert table.organization("") is None


@pytest.mark.parametrize("digest", ["s3cret", "ABC" * 21 + "D", "g" * 64])
def test_token_table_takes_only_sha256_digests(digest: str) -> None:
    with pytest.raises(ValueError, match="sha256"):
        TokenTable({digest: "org-a"})


def test_a_request_naming_two_different_events_by_one_id_is_refused() -> None:
    first = make_event("ada", "I live in Lisbon")
    other = first.model_copy(update={"content": "I live in Porto"})
    with pytest.raises(ValidationError, match="names two different events"):
        EventsRequest(events=[first, other])
    # The same event twice is one event; one id in two memories is two events.
    elsewhere = first.model_copy(update={"organization_id": "org-b"})
    assert len(EventsRequest(events=[first, first, elsewhere]).events) == 3


def test_a_page_cursor_names_its_last_fact_and_nothing_else_is_one() -> None:
    fact = make_fact("ada", "Ada read book 1")
    assert position(cursor_of(fact)) == (fact.created_at, fact.fact_id)
    for bad in ("", "bm90IGEgY3Vyc29y", "!!", cursor_of(fact)[:-4]):
        with pytest.raises(ValueError, match="not a cursor"):
            position(bad)


def test_the_no_connection_sentinel_is_no_connection_id() -> None:
    # A connection of the sentinel's id would be stored as no connection at all: its facts
    # would take the ids of the same texts outside every connection.
    assert NO_CONNECTION in RESERVED_CONNECTION_IDS
    with pytest.raises(ValidationError, match="reserved by memoryd"):
        SourceMetadata(source=Source.TOOL, connection_id=NO_CONNECTION)
    with pytest.raises(ValidationError, match="reserved by memoryd"):
        ContextRequest(user_id="ada", query="q", active_connection_ids=["gmail", NO_CONNECTION])
    assert SourceMetadata(source=Source.TOOL, connection_id="_none_").connection_id == "_none_"
    assert ContextRequest(user_id="ada", query="q", active_connection_ids=["none"])


@pytest.mark.parametrize("content", [REDACTION, REDACTED_JSON])
def test_an_erasures_marker_is_no_content_to_publish_or_correct_with(content: str) -> None:
    # The pipeline drops an event of that text as erased: accepted, it would vanish unseen,
    # and a correction of it would retract the fact and put nothing in its place.
    event = make_event("ada", "I use Gmail").model_dump(mode="json")
    with pytest.raises(ValidationError, match="reserved by memoryd"):
        EventsRequest.model_validate({"events": [{**event, "content": content}]})
    with pytest.raises(ValidationError, match="reserved by memoryd"):
        CorrectionRequest(content=content)
    assert CorrectionRequest(content=f"not {content}").content == f"not {content}"
