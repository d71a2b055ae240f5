"""The Gemini SDK's and transport's errors, sorted: worth a retry (with the wait the API asked
for, and the kind of failure for the metrics), a refusal of memoryd's credentials rather than of
the request, or neither.

The delay and the credentials' refusal are read from the google.rpc details of the error body
(`{"error": {..., "details": [...]}}`) and, for the delay, a Retry-After header.
"""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime
from typing import Any

import httpx
import httpx2
from google.genai import errors as genai_errors

from processors.errors import BackendFailure, TransientBackendError

# HTTP statuses that say "try again later" even though they are 4xx.
TRANSIENT_CLIENT_CODES = frozenset({408, 429})
# A server error that says the request itself is not served (not implemented): asking again
# changes nothing.
PERMANENT_SERVER_CODES = frozenset({501})
# The SDK uses httpx2 by default and httpx when GOOGLE_GENAI_HTTP_CLIENT=httpx: the two have
# separate exception trees. Timeouts, refused or reset connections and a server that hangs up
# mid-answer are worth a retry; other transport errors (bad URL scheme, ...) are configuration.
_TIMEOUTS: tuple[type[Exception], ...] = (httpx2.TimeoutException, httpx.TimeoutException)
TRANSIENT_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    *_TIMEOUTS,
    httpx2.NetworkError,
    httpx2.RemoteProtocolError,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx2.HTTPError, httpx.HTTPError)


def retried(e: Exception) -> TransientBackendError:
    """An error worth a retry, with its kind: an API error's by its HTTP status, a transport
    error's a timeout or a connection that failed or dropped."""
    if isinstance(e, genai_errors.APIError):
        kind = BackendFailure.of_status(e.code)
        return TransientBackendError(api_error(e), retry_after_s=retry_delay(e), failure=kind)
    kind = BackendFailure.TIMEOUT if isinstance(e, _TIMEOUTS) else BackendFailure.UNREACHABLE
    return TransientBackendError(transport_error(e), failure=kind)


def api_error(e: genai_errors.APIError) -> str:
    return f"gemini answered {e.code} {e.status}: {e.message}"


def transport_error(e: Exception) -> str:
    return f"gemini transport: {type(e).__name__}: {e}"


# 401 UNAUTHENTICATED and 403 PERMISSION_DENIED: the key is refused or barred from the API (a
# key deleted or restricted to other APIs, the API disabled for the key's project, the project
# suspended or its billing lapsed). A consolidation request names nothing a key may be denied
# on its own (no file, no tuned model), and a refusal of the content comes as a 200 with a
# block reason, so every request fails alike until the key or the project is fixed.
_CREDENTIALS_CODES = frozenset({401, 403})
# Gemini answers a revoked, expired or unknown API key with a 400 INVALID_ARGUMENT, told apart
# from a request it cannot read only by this ErrorInfo reason.
_KEY_INVALID = "API_KEY_INVALID"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
# A protobuf Duration in JSON: decimal seconds with an "s" ("37s", "1.5s", "0.250s").
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)s\s*$")


def refuses_credentials(e: genai_errors.APIError) -> bool:
    """Whether the API refused the key or its project, not this request."""
    if e.code in _CREDENTIALS_CODES:
        return True
    return any(
        d.get("@type") == _ERROR_INFO and d.get("reason") == _KEY_INVALID for d in _details(e)
    )


def retry_delay(e: genai_errors.APIError) -> float | None:
    """The wait the API asked for, in seconds: google.rpc.RetryInfo's `retryDelay` in the
    error's details (what a quota's 429 carries), else a Retry-After header (an overloaded
    503's); None if it named none. A quota resets in tens of seconds, so retrying sooner only
    spends attempts on more 429s."""
    for detail in _details(e):
        if detail.get("@type") == _RETRY_INFO:
            seconds = _duration_s(detail.get("retryDelay"))
            if seconds is not None:
                return seconds
    headers = getattr(e.response, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    return _retry_after_s(value) if isinstance(value, str) else None


def _details(e: genai_errors.APIError) -> list[dict[str, Any]]:
    """The google.rpc details of the error body; none if it has no readable ones."""
    body = e.details.get("error", e.details) if isinstance(e.details, dict) else None
    details = body.get("details") if isinstance(body, dict) else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def _duration_s(value: Any) -> float | None:
    match = _DURATION.match(value) if isinstance(value, str) else None
    return float(match[1]) if match else None


def _retry_after_s(value: str) -> float | None:
    """RFC 9110 Retry-After: delay-seconds, or an HTTP date (the wait until then)."""
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # neither form: as if the header were absent
    if when.tzinfo is None:  # an obsolete date form without a zone is GMT (RFC 9110)
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
