"""Outcomes, and helpers that map what an HTTP client saw to one.

Names are those of the JSON API. The helpers know requests, httpx and aiohttp by their
exception classes, found through the exception's own type: none of those libraries is imported
here.
"""

import enum
import email.utils
import time


class Outcome(str, enum.Enum):
    """An outcome; each member is also its JSON API name (a str)."""

    SUCCESS = "success"
    CONNECT_ERROR = "connect_error"
    TIMEOUT = "timeout"
    BLOCKED = "blocked"
    CAPTCHA = "captcha"
    RATE_LIMITED = "rate_limited"

    def __str__(self):
        return self.value


# The markers of common captcha and challenge pages; the proxypool server's default list.
CAPTCHA_MARKERS = (
    "g-recaptcha",
    "h-captcha",
    "cf-challenge",
    "/cdn-cgi/challenge-platform/",
)

# Exception classes by "module.QualName", most specific first within each library.
_TIMEOUTS = {
    "httpx.TimeoutException",
    "requests.exceptions.Timeout",
    "aiohttp.client_exceptions.ServerTimeoutError",
    "aiohttp.client_exceptions.ConnectionTimeoutError",
    "aiohttp.client_exceptions.SocketTimeoutError",
    "builtins.TimeoutError",
    "asyncio.exceptions.TimeoutError",
    "socket.timeout",
}
_CONNECT_ERRORS = {
    "httpx.TransportError",
    "requests.exceptions.ConnectionError",
    "aiohttp.client_exceptions.ClientConnectionError",
    "aiohttp.client_exceptions.ClientProxyConnectionError",
    "builtins.ConnectionError",
}


def _names(exc):
    for cls in type(exc).__mro__:
        module = cls.__module__
        # httpx and requests define their classes in private modules and re-export them.
        if module.startswith("httpx."):
            module = "httpx"
        yield f"{module}.{cls.__qualname__}"


def outcome_for_exception(exc):
    """The outcome an exception stands for: `timeout` for the clients' timeouts,
    `connect_error` for everything else (the proxy could not carry the request)."""
    for name in _names(exc):
        if name in _TIMEOUTS:
            return Outcome.TIMEOUT
        if name in _CONNECT_ERRORS:
            return Outcome.CONNECT_ERROR
    return Outcome.CONNECT_ERROR


def _retry_after(headers):
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def outcome_for_response(response, text=None, captcha_markers=CAPTCHA_MARKERS):
    """(outcome, retry_after) for an HTTP response of requests, httpx or aiohttp: 403 is
    `blocked`, 429 `rate_limited` (with its Retry-After seconds, if any), a body with a captcha
    marker `captcha`, anything else `success`. `text` is the body when the response does not
    hold it as a str (aiohttp: `await response.text()`)."""
    status = getattr(response, "status_code", None)
    if status is None:
        status = getattr(response, "status", None)
    if status == 403:
        return Outcome.BLOCKED, None
    if status == 429:
        return Outcome.RATE_LIMITED, _retry_after(getattr(response, "headers", None))
    if text is None:
        body = getattr(response, "text", None)
        text = body if isinstance(body, str) else ""
    if any(marker in text for marker in captcha_markers):
        return Outcome.CAPTCHA, None
    return Outcome.SUCCESS, None
