"""HTTP/1.1 keep-alive for the built-in model server.

werkzeug's server ends every response with `Connection: close` (and, after each one, reads whatever else the
socket holds for 10 ms, which would swallow a keep-alive client's next request), so a gateway opened a new TCP
connection to the replica for every request. This handler keeps the connection open between requests:

- every response says how long it is: `Content-Length` when the application set it (Flask's JSON answers, errors
  included), else chunked transfer encoding (streams); an HTTP/1.0 client gets `Connection: close` instead;
- a request body the application did not read is read and dropped before the next request (up to
  DRAIN_MAX_BYTES; a larger remainder, or a chunked body, closes the connection);
- a connection idle for `timeout` seconds is closed, so idle keep-alive connections do not pin threads;
- once the server is stopping (`server.stopping`) every response closes its connection, so the drain ends.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from werkzeug.exceptions import InternalServerError
from werkzeug.serving import WSGIRequestHandler
from werkzeug.wsgi import LimitedStream

log = logging.getLogger("gswarm.model_server")

IDLE_S = 15.0  # an idle keep-alive connection is closed after this long
DRAIN_MAX_BYTES = 1 << 20
DROPPED = (ConnectionError, TimeoutError)
_accepted = [0]
_lock = threading.Lock()


def accepted() -> int:
    """Connections this process's server accepted (on /health: a client that reuses its connection adds none)."""
    return _accepted[0]


def make_server(host: str, port: int, app: Any, idle_s: float = IDLE_S) -> Any:
    """A threaded werkzeug server with keep-alive connections closed after `idle_s` idle seconds; set its
    `stopping` before shutting it down so that the connections close after their current response."""
    from werkzeug.serving import make_server as werkzeug_server

    handler = type("Handler", (KeepAliveHandler,), {"timeout": idle_s})
    server: Any = werkzeug_server(host, port, app, threaded=True, request_handler=handler)
    server.stopping = False
    return server


class KeepAliveHandler(WSGIRequestHandler):
    """werkzeug's WSGI handler with keep-alive connections (see the module's docstring)."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_S  # the socket's timeout: an idle connection's read of its next request line ends after it
    disable_nagle_algorithm = (
        True  # a response's head and body go out as two writes: no wait for an ACK between
    )

    def setup(self) -> None:
        with _lock:
            _accepted[0] += 1
        super().setup()

    def run_wsgi(self) -> None:
        if self.headers.get("Expect", "").lower().strip(" \t") == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        environ = self.environ = self.make_environ()
        body = _body(environ)
        reply = _Reply(self, environ, body)
        try:
            reply.run(self.server.app)
        except DROPPED:
            self.close_connection = True
            return
        except Exception:
            self.close_connection = True
            log.exception("error on %s %s", self.command, self.path)
            if reply.sent:
                return  # the head is out: the cut connection is all the client learns
            try:
                _Reply(self, environ, body).run(InternalServerError())
            except Exception:
                pass
            return
        if body is None:
            self.close_connection = True  # a chunked body: where it ends is not worth finding out
        elif not self.close_connection and body.tell() < body.limit:
            self.close_connection = body.limit - body.tell() > DRAIN_MAX_BYTES
            if not self.close_connection:
                body.exhaust()  # the rest of the body, so that the next request line is read next

    def log_error(self, format: str, *args: Any) -> None:
        if format.startswith("Request timed out"):  # an idle keep-alive connection reached its timeout
            log.debug("closed an idle connection from %s", self.address_string())
            return
        super().log_error(format, *args)


def _body(environ: dict[str, Any]) -> LimitedStream | None:
    """The request body as a stream that knows how much of it was read (None: chunked, its length unknown)."""
    if environ.get("wsgi.input_terminated"):
        return None
    length = environ.get("CONTENT_LENGTH", "")
    stream = LimitedStream(environ["wsgi.input"], int(length) if length.isdigit() else 0)
    environ["wsgi.input"] = stream
    return stream


class _Reply:
    """One response on the connection: its head (with its length or chunked) and its body."""

    def __init__(
        self, handler: KeepAliveHandler, environ: dict[str, Any], body: LimitedStream | None
    ) -> None:
        self.h, self.environ, self.body = handler, environ, body
        self.status: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.sent = self.chunked = False

    def run(self, app: Any) -> None:
        chunks = app(self.environ, self.start_response)
        try:
            for data in chunks:
                self.write(data)
            if not self.sent:
                self.write(b"")
            if self.chunked:
                self.h.wfile.write(b"0\r\n\r\n")
                self.h.wfile.flush()
        finally:
            if hasattr(chunks, "close"):
                chunks.close()

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if exc_info:
            try:
                if self.sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("Headers already set")
        self.status, self.headers = status, headers
        return self.write

    def write(self, data: bytes) -> None:
        assert self.status is not None, "write() before start_response"
        if not self.sent:
            self.head()
        if data:
            if self.chunked:
                self.h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self.h.wfile.write(data)
        self.h.wfile.flush()

    def head(self) -> None:
        assert self.status is not None
        code_text, _, phrase = self.status.partition(" ")
        code = int(code_text)
        h = self.h
        h.send_response(code, phrase)
        names = set()
        for key, value in self.headers:
            if key.lower() not in ("connection", "keep-alive", "transfer-encoding"):
                h.send_header(key, value)
                names.add(key.lower())
        bodiless = self.environ["REQUEST_METHOD"] == "HEAD" or code < 200 or code in (204, 304)
        unread = 0 if self.body is None else self.body.limit - self.body.tell()
        if (
            h.request_version != "HTTP/1.1"
            or getattr(h.server, "stopping", False)
            or self.body is None
            or unread > DRAIN_MAX_BYTES
        ):
            h.close_connection = True
        if "content-length" not in names and not bodiless and not h.close_connection:
            self.chunked = True  # else the body ends where the connection does
            h.send_header("Transfer-Encoding", "chunked")
        if h.close_connection:
            h.send_header("Connection", "close")
        h.end_headers()
        self.sent = True
