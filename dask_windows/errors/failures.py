"""Which kind of failure an error is, and the message that names its remedy.

``classify`` sorts every failure once into ``FAILURE_KINDS``; each kind has its remedy
(``failure_message``) and its ``on_error`` rule (``faults.skip_allowed``). Errors and their causes
are judged by type names, errno values and status codes, so botocore, aiohttp, gcsfs and adlfs
errors are recognised without importing them."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from dask_windows.errors import SourceReadError
from dask_windows.errors.remedies import missing_backend

__all__ = [
    "FAILURE_KINDS",
    "classify",
    "describe_failure",
    "error_text",
    "failure_message",
    "is_transient",
    "is_unreachable",
]

TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNRESET",
        "ECONNABORTED",
        "ECONNREFUSED",
        "ETIMEDOUT",
        "EPIPE",
        "EAGAIN",
        "EBUSY",  # s3fs: SlowDown / ServiceUnavailable / 503
        "EREMOTEIO",  # s3fs: InternalError / 500
        "ENETUNREACH",
        "ENETRESET",
        "EHOSTUNREACH",
    )
    if hasattr(errno, name)
)

#: Exception class names (anywhere in the MRO) of connection-level failures.
TRANSIENT_TYPES = frozenset(
    {
        "ConnectionError",  # builtin and botocore.exceptions.ConnectionError
        "TimeoutError",
        "HTTPClientError",  # botocore: ConnectionClosedError, ReadTimeoutError, ...
        "IncompleteReadError",
        "IncompleteRead",
        "ClientConnectionError",  # aiohttp
        "ClientPayloadError",
        "ServerTimeoutError",
        "FSTimeoutError",  # fsspec
        "ResponseParserError",
    }
)

#: Exception class names that are never retried, wherever they appear first.
PERMANENT_TYPES = frozenset(
    {"FileNotFoundError", "PermissionError", "IsADirectoryError", "NotADirectoryError", "ArrowInvalid", "KeyError"}
)

#: Service error codes meaning "slow down" or "try again".
TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "BandwidthLimitExceeded",
    }
)


def _status(exc: BaseException) -> int | None:
    """HTTP status carried by ``exc`` (botocore ``response``, ``status``, ``code``, ``status_code``)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    for attr in ("status_code", "status", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    return None


def _classify(exc: BaseException) -> bool | None:
    """``True`` transient, ``False`` permanent, ``None`` unknown, for ``exc`` alone."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & PERMANENT_TYPES:
        return False
    if names & TRANSIENT_TYPES:
        return True
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error", {}).get("Code") in TRANSIENT_CODES:
        return True
    status = _status(exc)
    if status is not None:
        return status == 429 or status >= 500
    return None


def _first_decided(exc: BaseException, judge: Callable[[BaseException], Any]) -> Any:
    """``judge``'s first answer other than ``None`` along ``exc``'s ``__cause__`` / ``__context__``
    chain (at most 16 links, each once: wrappers such as s3fs and pyarrow re-raise the store's error)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        verdict = judge(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or a cause) may pass on a later attempt: connection resets and timeouts, throttling
    (429, ``SlowDown``) and server errors (5xx); not a missing object, a denied access or a corrupt file."""
    verdict = _first_decided(exc, _classify)
    return False if verdict is None else verdict


#: The kinds of failure, each with its own message and ``on_error`` behaviour (``classify``).
FAILURE_KINDS = ("transient", "resource", "permission", "missing", "corrupt")

#: errno values meaning the machine ran out of something: retrying or skipping cannot help.
RESOURCE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("EMFILE", "ENFILE", "ENOMEM", "ENOSPC", "EDQUOT", "ENOBUFS")
    if hasattr(errno, name)
)
PERMISSION_ERRNOS = frozenset(getattr(errno, name) for name in ("EACCES", "EPERM", "EROFS") if hasattr(errno, name))
MISSING_ERRNOS = frozenset(getattr(errno, name) for name in ("ENOENT", "EISDIR", "ENOTDIR") if hasattr(errno, name))
RESOURCE_TYPES = frozenset({"MemoryError", "ArrowMemoryError", "OutOfMemoryError"})
PERMISSION_TYPES = frozenset(
    {"PermissionError", "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
)
MISSING_TYPES = frozenset({"FileNotFoundError", "IsADirectoryError", "NotADirectoryError", "NoSuchBucket", "NoSuchKey"})
PERMISSION_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
        "AuthFailure",
        "Forbidden",
    }
)
MISSING_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound", "404"})
#: Message fragments of errors raised without an errno (pyarrow's own ``OSError`` text).
RESOURCE_TEXT = ("too many open files", "cannot allocate memory", "no space left on device", "out of memory")


def _kind(exc: BaseException) -> str | None:
    """The kind of ``exc`` alone, or ``None`` when it says nothing (a wrapper)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    code = None
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
    number = getattr(exc, "errno", None)
    if names & RESOURCE_TYPES or number in RESOURCE_ERRNOS:
        return "resource"
    if isinstance(exc, OSError) and any(t in str(exc).lower() for t in RESOURCE_TEXT):
        return "resource"
    if names & PERMISSION_TYPES or number in PERMISSION_ERRNOS or code in PERMISSION_CODES:
        return "permission"
    if names & MISSING_TYPES or number in MISSING_ERRNOS or code in MISSING_CODES:
        return "missing"
    status = _status(exc)
    if status in (401, 403):
        return "permission"
    if status == 404:
        return "missing"
    verdict = _classify(exc)
    if verdict is True:
        return "transient"
    if verdict is False:
        return "corrupt"
    kind = getattr(exc, "kind", None)  # a SourceReadError made by failure_message's caller
    return kind if kind in FAILURE_KINDS else None


def classify(exc: BaseException) -> str:
    """Which of ``FAILURE_KINDS`` ``exc`` (or what caused it; the first decisive link wins) is.

    ``resource``: the machine ran out of something (``EMFILE``, ``ENOMEM``, ``ENOSPC``...); ``permission``:
    access denied or no credentials (``EACCES``, HTTP 401/403); ``missing``: no such file, bucket or key,
    or a folder (HTTP 404); ``transient``: see ``is_transient``; ``corrupt``: anything else."""
    kind = _first_decided(exc, _kind)
    return "corrupt" if kind is None else kind


#: What to do about each kind of failure, quoted in the messages.
REMEDIES = {
    "transient": "the store kept failing; check the connection or the endpoint, or pass a larger retries= or timeout=",
    "resource": (
        "the machine ran out of a resource (open files, memory or disk), not a fault of the data; raise the limit "
        "(`ulimit -n` for open files), or lower threads=, num_workers=, prefetch_partitions= or buffer_partitions=, "
        "or free memory or disk; this is never skipped, even with on_error='skip'"
    ),
    "permission": (
        "access was denied; check the credentials (storage_options key/secret/profile or the environment; "
        "storage_options={'anon': True} for a public bucket) or the file's permissions; this is never skipped, "
        "even with on_error='skip'"
    ),
    "missing": (
        "it does not exist, or is a folder rather than a file; check the path or URL (bucket and key), "
        "open the dataset again if it changed, or pass on_error='skip' to leave it out"
    ),
    "corrupt": (
        "the file is not Parquet, truncated or corrupt; rewrite it or remove it from the dataset, "
        "or pass on_error='skip' to leave it out"
    ),
}


def failure_message(
    kind: str, what: str, exc: BaseException, where: str = "", opening: bool = False
) -> SourceReadError:
    """A ``SourceReadError`` for ``what`` (``"cannot read s3://b/k"``) failing with ``exc`` of ``kind``,
    naming the remedy and ``where`` (``"column 'f1' of row group 3 is damaged"``), and while ``opening``
    that a transient failure is not skipped; ``kind`` and ``where`` are set on it for the callers."""
    tries = describe_failure(exc) if kind == "transient" else ""
    place = f"; {where}" if where else ""
    remedy = missing_backend(exc, what) or REMEDIES[kind]
    error = SourceReadError(f"{what}{tries}: {error_text(exc)}{place}; {remedy}")
    if opening and kind == "transient":
        error.args = (error.args[0] + OPENING_NOTE,)
    error.kind = kind  # type: ignore[attr-defined]
    error.where = where  # type: ignore[attr-defined]
    return error


#: Why a transient failure at open raises even with ``on_error="skip"``.
OPENING_NOTE = " (not skipped while opening, even with on_error='skip', so every rank opens the same dataset)"

#: Failures to connect at all: the client (botocore, aiohttp) already retried the connection.
#: (``EndpointConnectionError`` alone is not one: aiobotocore also raises it for a connection reset.)
UNREACHABLE_TYPES = frozenset({"ConnectionRefusedError", "ClientConnectorError"})


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or a cause) says the endpoint could not be connected to at all: transient, but the
    storage client already retried connecting, so retrying again only delays the report."""
    return _first_decided(exc, _unreachable) is True


def _unreachable(exc: BaseException) -> bool | None:
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "ConnectionResetError" in names or getattr(exc, "errno", None) == errno.ECONNRESET:
        return False
    if names & UNREACHABLE_TYPES or getattr(exc, "errno", None) == errno.ECONNREFUSED:
        return True
    return None


def error_text(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc`` on one line, for messages that quote it."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def describe_failure(exc: BaseException) -> str:
    """``"after N tries"`` when a policy retried ``exc``, else an empty string."""
    attempts = getattr(exc, "attempts", 1)
    return f" after {attempts} tries" if isinstance(attempts, int) and attempts > 1 else ""
