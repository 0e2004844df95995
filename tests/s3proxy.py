"""A real S3 endpoint on 127.0.0.1 for the tests: moto's server, behind a counting, fault-injecting proxy.

The client (s3fs, exactly as a user configures it) talks HTTP to the proxy,
which forwards every request to moto and records it. ``fail(n, kind, match)``
makes the next ``n`` matching requests fail before they reach moto: an S3
``500 InternalError``, a ``503 SlowDown``, a ``403 AccessDenied``, a connection reset, or a ``stall``
(the request is read and never answered, until ``close()``). ``delay`` (seconds, default 0) is
added before every request is forwarded, on its own thread (concurrent requests wait at once), as
an object store's latency would.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "403": (403, "AccessDenied", "Access Denied"),
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Request:
    """One request seen by the proxy."""

    method: str
    path: str
    query: dict
    range: str | None
    injected: str | None = None

    @property
    def kind(self) -> str:
        """``list``, ``head``, ``get`` (object data) or the method."""
        if (self.method == "GET" and "list-type" in self.query) or (self.method == "GET" and self.path.count("/") == 1):
            return "list"
        return {"HEAD": "head", "GET": "get"}.get(self.method, self.method.lower())


@dataclass
class _Rule:
    remaining: int
    kind: str
    match: Callable[[Request], bool]


@dataclass
class Log:
    requests: list[Request] = field(default_factory=list)
    rules: list[_Rule] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # ends every "stall"
    delay: float = 0.0  # seconds added to every request (latency injection)

    def count(self, kind: str | None = None, injected: bool = False) -> int:
        with self.lock:
            return sum(
                1 for r in self.requests if (kind is None or r.kind == kind) and (r.injected is not None) == injected
            )


def _handler(upstream: tuple[str, int], log: Log) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _forward(self) -> None:
            parts = urlsplit(self.path)
            request = Request(self.command, parts.path, parse_qs(parts.query), self.headers.get("Range"))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            with log.lock:
                rule = next((r for r in log.rules if r.remaining > 0 and r.match(request)), None)
                if rule is not None:
                    rule.remaining -= 1
                    request.injected = rule.kind
                log.requests.append(request)
            if log.delay:
                time.sleep(log.delay)
            if rule is not None and rule.kind == "stall":  # accept, read the request, never answer
                log.release.wait(120)
                self.close_connection = True
                return
            if rule is not None and rule.kind == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if rule is not None:
                status, code, message = _ERRORS[rule.kind]
                payload = (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>{message}</Message><RequestId>proxy</RequestId></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            conn = http.client.HTTPConnection(*upstream, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            self.send_response(response.status)
            for k, v in response.getheaders():
                if k.lower() not in _HOP and (k.lower() != "content-length" or self.command == "HEAD"):
                    self.send_header(k, v)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


class S3Endpoint:
    """moto's S3 server on 127.0.0.1 and a proxy in front of it; ``close()`` stops both."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.moto_port = free_port()
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.moto_port, verbose=False)
        self.moto.start()
        # moto keeps its buckets in process-wide backends that outlive a server: start from an empty
        # store, or a bucket of the same name from an earlier test file leaks its objects in here.
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.moto_url}/moto-api/reset", method="POST"), timeout=30)
        self.log = Log()
        self.proxy = ThreadingHTTPServer(("127.0.0.1", 0), _handler(("127.0.0.1", self.moto_port), self.log))
        self.proxy.daemon_threads = True
        self._thread = threading.Thread(target=self.proxy.serve_forever, name="s3-proxy", daemon=True)
        self._thread.start()

    @property
    def moto_url(self) -> str:
        return f"http://127.0.0.1:{self.moto_port}"

    @property
    def url(self) -> str:
        """The proxy's URL: what the code under test talks to."""
        return f"http://127.0.0.1:{self.proxy.server_address[1]}"

    def storage_options(self, direct: bool = False, client_retries: bool = True) -> dict:
        """``storage_options`` a user would pass (``client_retries=False``: botocore makes one attempt)."""
        options: dict = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.moto_url if direct else self.url, "region_name": "us-east-1"},
            "skip_instance_cache": True,
        }
        if not client_retries:
            options["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
        return options

    def make_bucket(self, bucket: str) -> None:
        """Create ``bucket`` straight on moto (setup, not counted)."""
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.moto_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=bucket)

    def fail(self, n: int, kind: str = "500", match: Callable[[Request], bool] | None = None) -> None:
        """Fail the next ``n`` requests matching ``match`` (default: object data reads)."""
        with self.log.lock:
            self.log.rules.append(_Rule(n, kind, match or (lambda r: r.kind == "get")))

    def set_delay(self, seconds: float) -> None:
        """Add ``seconds`` of latency to every later request (0: none)."""
        self.log.delay = seconds

    def reset(self) -> None:
        """Forget requests and fault rules."""
        with self.log.lock:
            self.log.requests.clear()
            self.log.rules.clear()

    def close(self) -> None:
        self.log.release.set()
        self.proxy.shutdown()
        self.proxy.server_close()
        self.moto.stop()
