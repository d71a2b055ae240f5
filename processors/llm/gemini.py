"""The Gemini consolidation backend, through google-genai.

The SDK is told never to retry: the consumer retries per user with backoff, and retries hidden
in here would multiply its attempts and stall the other users' flushes. SDK and transport
errors are translated once (`gemini_errors`), into `TransientBackendError` (retry, with the
delay the API asked for), `CredentialsRefused` (the key or its project refused: waited out
until an operator fixes it) or `BackendError` (dead letter). `response.parsed` is not trusted:
the SDK leaves it `None`, without an error, for truncated, fenced, wrongly typed or blocked
output, so the text is parsed here and a failure always raises `UnusableAnswer` (the consumer
bisects the batch), never yields an empty result. The response's usage goes with the error: an
unusable answer is still billed. The SDK is not even given the schema to parse with (see
`_schema_body`): its own decoding raises on some answers before their usage can be read.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pydantic
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from domain.model import FactType, TokenUsage
from processors.errors import (
    BackendError,
    BackendFailure,
    CredentialsRefused,
    TransientBackendError,
    UnusableAnswer,
)
from processors.llm.gemini_errors import (
    PERMANENT_SERVER_CODES,
    TRANSIENT_CLIENT_CODES,
    TRANSIENT_TRANSPORT_ERRORS,
    TRANSPORT_ERRORS,
    api_error,
    refuses_credentials,
    retried,
    transport_error,
)
from processors.llm.thinking import DEFAULT_THINKING_BUDGET
from processors.normalize import (
    normalize_json,
    storable_json,
    strip_fences,
    truncate_at_sentence,
    truncate_text,
)
from processors.prompt import PROMPT_VERSION, build_prompt, output_json_schema
from processors.schema import (
    MAX_FACT_CHARS,
    MAX_FACTS_PER_RUN,
    MAX_WORKING_MEMORY_CHARS,
    MAX_WORKING_MEMORY_WORDS,
    BackendResponse,
    ConsolidationOutput,
    ConsolidationRequest,
)

log = logging.getLogger(__name__)

_FACT_TYPES = frozenset(t.value for t in FactType)

DEFAULT_MODEL = "gemini-2.5-flash"
# The room for the answer's text, thinking not included. S is answered as a patch, so its
# size is not in it: a W at its cap is some 1,500 tokens in English and 6,000 in CJK (about a
# token a character), forty facts a few thousand more. Only the tokens produced are billed,
# so room an answer does not use costs nothing; but a model caught repeating itself runs on
# until it is cut here or by the call's timeout, so the room is not made larger than it needs.
DEFAULT_MAX_OUTPUT_TOKENS = 16_384
# What Gemini 2.5 models produce at most in one answer, thinking included.
MODEL_OUTPUT_LIMIT = 65_536
API_VERSION = "v1beta"

_MAX_REASON_CHARS = 500
# Mirrors `FactProposal.evidence`'s max_length.
_MAX_EVIDENCE = 20


def make_gemini_client(api_key: str, base_url: str | None, timeout_ms: int) -> genai.Client:
    """A client with a per-request timeout and no SDK retries (`retry_options` unset)."""
    options = types.HttpOptions(
        base_url=base_url, api_version=API_VERSION, timeout=timeout_ms, retry_options=None
    )
    return genai.Client(api_key=api_key, http_options=options)


class GeminiBackend:
    """`ConsolidationBackend` on Gemini structured output (`responseJsonSchema`)."""

    name = "gemini"

    def __init__(
        self,
        client: genai.Client,
        model: str = DEFAULT_MODEL,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        thinking_budget: int | None = DEFAULT_THINKING_BUDGET,
    ) -> None:
        self._client = client
        self.model = model
        self.prompt_version = PROMPT_VERSION
        # A 2.5 model's thinking counts against the request's max_output_tokens, and left
        # to itself it may think the answer's room away: no text, MAX_TOKENS, and the batch
        # bisected at the price of more calls. So thinking gets its own budget, asked on top
        # of the answer's room. None: the model's own default (for models that take none).
        budget = thinking_budget
        self._max_output_tokens = output_tokens(max_output_tokens, budget)
        self._thinking = None if budget is None else types.ThinkingConfig(thinking_budget=budget)
        self._schema_body = _schema_body(output_json_schema())

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        prompt = build_prompt(request)
        config = types.GenerateContentConfig(
            system_instruction=prompt.system_instruction,
            temperature=0,
            response_mime_type="application/json",
            http_options=self._schema_body,
            max_output_tokens=self._max_output_tokens,
            # The SDK would otherwise send the request again while the model stops with
            # CONTINUATION, each hop billed and timed on its own: `max_output_tokens` would
            # bound nothing, a call no time, and a hop failing would lose the earlier hops'
            # usage. A cut answer is unusable like a truncated one (the batch is bisected).
            automatic_continuation=False,
            thinking_config=self._thinking,
        )
        response = self._generate(prompt.user_content, config)
        usage = token_usage(response)
        try:
            text = _response_text(response)
            output = parse_output(text, finish_reason=_finish_reason(response))
        except UnusableAnswer as e:
            e.usage = usage
            raise
        return BackendResponse(output=output, raw_response=text, usage=usage, model=self.model)

    def _generate(
        self, contents: str, config: types.GenerateContentConfig
    ) -> types.GenerateContentResponse:
        try:
            return self._client.models.generate_content(
                model=self.model, contents=contents, config=config
            )
        except genai_errors.ClientError as e:
            if refuses_credentials(e):
                raise CredentialsRefused(api_error(e), failure=BackendFailure.REFUSED) from e
            if e.code in TRANSIENT_CLIENT_CODES:
                raise retried(e) from e
            raise BackendError(api_error(e)) from e
        except genai_errors.ServerError as e:
            if e.code in PERMANENT_SERVER_CODES:
                raise BackendError(api_error(e)) from e
            raise retried(e) from e
        except genai_errors.APIError as e:
            raise BackendError(api_error(e)) from e
        except genai_errors.UnknownApiResponseError as e:
            # The HTTP answer itself is broken (cut short by a proxy or a dropped connection),
            # which says nothing about the batch: retried, up to the attempts allowed.
            raise TransientBackendError(f"gemini answered something that is not JSON: {e}") from e
        except json.JSONDecodeError as e:
            # The SDK json.loads the HTTP body bare (it catches this error where it decodes
            # the model's text for `.parsed`): a body that is not JSON was cut short on its way,
            # which says nothing about the batch.
            raise TransientBackendError(f"gemini answered something that is not JSON: {e}") from e
        except (ValueError, RecursionError) as e:
            # The SDK's own refusal of the request, or an HTTP body it cannot decode otherwise
            # (a too-long integer, absurd nesting). The model's answer itself is never decoded
            # by the SDK (`_schema_body`), so an answer like that reaches `parse_output` with
            # its usage. Permanent for this input.
            reason = f"gemini answer not decodable: {type(e).__name__}: {e}"
            raise UnusableAnswer(reason) from e
        except TRANSIENT_TRANSPORT_ERRORS as e:
            raise retried(e) from e
        except TRANSPORT_ERRORS as e:
            raise BackendError(transport_error(e)) from e


def _schema_body(schema: dict[str, Any]) -> types.HttpOptions:
    """The output schema as part of the request body, outside the config the SDK reads.

    Given `response_json_schema`, the SDK json.loads the answer's text for `.parsed` and catches
    only JSONDecodeError: an integer over 4,300 digits (ValueError) or absurd nesting
    (RecursionError) escapes from `generate_content`, and the usage of a call that was paid
    with it. Not `response_schema` either: the SDK rejects `additionalProperties` there outside
    Vertex AI, and the scaffold is a free-form object. A request's options replace only those
    of the client's they set: the timeout stays the client's.
    """
    return types.HttpOptions(extra_body={"generationConfig": {"responseJsonSchema": schema}})


def output_tokens(answer_tokens: int, thinking_budget: int | None) -> int:
    """The request's max_output_tokens: the answer's room plus thinking's budget."""
    total = answer_tokens + (thinking_budget or 0)
    if total > MODEL_OUTPUT_LIMIT:
        raise ValueError(
            f"{answer_tokens} answer tokens and a thinking budget of {thinking_budget} exceed"
            f" the {MODEL_OUTPUT_LIMIT} output tokens a model answers with"
        )
    return total


def _finish_reason(response: types.GenerateContentResponse) -> str | None:
    if not response.candidates or response.candidates[0].finish_reason is None:
        return None
    return str(response.candidates[0].finish_reason.value)


def _response_text(response: types.GenerateContentResponse) -> str:
    """The answer's text; without one, an error carrying the whole response for the run record."""
    feedback = response.prompt_feedback
    if feedback is not None and feedback.block_reason is not None:
        detail = f" ({feedback.block_reason_message})" if feedback.block_reason_message else ""
        reason = f"gemini blocked the prompt: {feedback.block_reason.value}{detail}"
        raise UnusableAnswer(reason, raw_response=_dump(response))
    if not response.candidates:
        raise UnusableAnswer("gemini returned no candidates", raw_response=_dump(response))
    text = response.text
    if not text:
        reason = f"gemini returned no text (finish_reason={_finish_reason(response)})"
        raise UnusableAnswer(reason, raw_response=_dump(response))
    return text


def _dump(response: types.GenerateContentResponse) -> str:
    return response.model_dump_json(exclude={"sdk_http_response"}, exclude_none=True)


def token_usage(response: types.GenerateContentResponse) -> TokenUsage:
    meta = response.usage_metadata
    if meta is None:
        return TokenUsage()
    # Thinking tokens are billed as output, so they count as completion. The prompt count
    # includes what the context cache served (Gemini 2.5 caches repeated prefixes on its own,
    # such as the system instruction), which is billed at the cached rate.
    completion = (meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0)
    return TokenUsage(
        prompt_tokens=meta.prompt_token_count or 0,
        completion_tokens=completion,
        cached_prompt_tokens=meta.cached_content_token_count or 0,
    )


def parse_output(text: str, finish_reason: str | None = None) -> ConsolidationOutput:
    """Fences stripped, JSON decoded, nested JSON strings normalized, caps fitted, validated.

    Raises `UnusableAnswer` carrying `text`; the message names the finish reason when the model
    stopped for anything but STOP, since that (MAX_TOKENS, SAFETY) is usually why.
    """
    stopped = "" if finish_reason in (None, "STOP") else f" (finish_reason={finish_reason})"
    try:
        document = storable_json(normalize_json(json.loads(strip_fences(text))))
    # ValueError, not only JSONDecodeError: an integer literal too long to convert raises the
    # former. RecursionError: absurdly nested arrays, which a runaway model can emit.
    except (ValueError, RecursionError) as e:
        raise UnusableAnswer(f"output is not JSON{stopped}: {e}", raw_response=text) from e
    if not isinstance(document, dict):
        kind = type(document).__name__
        reason = f"output is a JSON {kind}, not an object{stopped}"
        raise UnusableAnswer(reason, raw_response=text)
    for note in fit_caps(document):
        log.warning("gemini output trimmed to fit caps: %s", note)
    try:
        return ConsolidationOutput.model_validate(document)
    except pydantic.ValidationError as e:
        reason = f"output does not match the schema{stopped}: {e}"[:_MAX_REASON_CHARS]
        raise UnusableAnswer(reason, raw_response=text) from e


def fit_caps(document: dict[str, Any]) -> list[str]:
    """Trim, in place, what only exceeds a length cap, so length alone never fails a run;
    clamp scores and read an unknown fact type as the generic one (`_fit_fact_fields`).

    Returns one note per trimmed or clamped field. The planner may cap W again; doing it twice is
    harmless, while a validation failure here would dead-letter an otherwise good batch.
    """
    notes: list[str] = []
    memory = document.get("updated_working_memory")
    if isinstance(memory, str):
        capped = truncate_at_sentence(memory, MAX_WORKING_MEMORY_CHARS, MAX_WORKING_MEMORY_WORDS)
        if capped != memory:
            document["updated_working_memory"] = capped
            notes.append(f"updated_working_memory {len(memory)} -> {len(capped)} chars")
    for key in ("facts", "facts_to_embed"):
        items = document.get(key)
        if isinstance(items, list) and len(items) > MAX_FACTS_PER_RUN:
            document[key] = items[:MAX_FACTS_PER_RUN]
            notes.append(f"{key} {len(items)} -> {MAX_FACTS_PER_RUN} items")
    notes += _fit_fact_texts(document)
    notes += _fit_fact_fields(document)
    return notes


def _fit_fact_fields(document: dict[str, Any]) -> list[str]:
    """Scores clamped into [0, 1] (1.2 or a percentage such as 85 is the top of the scale, not
    a reason to refuse the answer) and a fact type off the list read as the generic profile,
    the type a fact stating none has. An op or a surface off the list still fails: read as an
    add, a "delete" would store what the model meant to remove; read as "speak", a fact meant
    to be avoided would be said."""
    notes: list[str] = []
    facts = document.get("facts")
    for fact in facts if isinstance(facts, list) else []:
        if not isinstance(fact, dict):
            continue
        for key in ("confidence", "salience"):
            value = fact.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                clamped = min(max(value, 0.0), 1.0)
                if clamped != value:
                    fact[key] = clamped
                    notes.append(f"fact {key} {value} -> {clamped}")
        kind = fact.get("type")
        if isinstance(kind, str) and kind not in _FACT_TYPES:
            known = kind.casefold() in _FACT_TYPES
            fact["type"] = kind.casefold() if known else FactType.PROFILE.value
            notes.append(f"fact type {kind[:40]!r} -> {fact['type']}")
    return notes


def _fit_fact_texts(document: dict[str, Any]) -> list[str]:
    notes: list[str] = []
    legacy = document.get("facts_to_embed")
    if isinstance(legacy, list):
        document["facts_to_embed"] = [_fit_fact(c, notes) for c in legacy]
    facts = document.get("facts")
    if isinstance(facts, list):
        for fact in facts:
            if not isinstance(fact, dict):
                continue
            if "content" in fact:
                fact["content"] = _fit_fact(fact["content"], notes)
            evidence = fact.get("evidence")
            if isinstance(evidence, list) and len(evidence) > _MAX_EVIDENCE:
                fact["evidence"] = evidence[:_MAX_EVIDENCE]
                notes.append(f"fact evidence {len(evidence)} -> {_MAX_EVIDENCE} labels")
    return notes


def _fit_fact(content: Any, notes: list[str]) -> Any:
    if not isinstance(content, str) or len(content.strip()) <= MAX_FACT_CHARS:
        return content
    notes.append(f"fact content {len(content)} -> {MAX_FACT_CHARS} chars")
    return truncate_text(content.strip(), MAX_FACT_CHARS)
