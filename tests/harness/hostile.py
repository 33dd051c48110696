"""Hostile inputs the tests share, and a real HTTP server on 127.0.0.1 that records every request reaching it."""

from __future__ import annotations

import http.server
import threading

# The data.allowed_hosts bypass: urllib's urlparse reads host `allowed.example`; requests/urllib3 connect to
# 127.0.0.1:PORT.
SSRF = "http://127.0.0.1:{port}\\@allowed.example/../x"

# About 600 bytes that expand to 10^9 strings (one list referenced ten times, nine levels deep).
ALIAS_BOMB = "\n".join(
    ["name: bomb", f"l0: &l0 [{','.join(['lolololol'] * 10)}]"]
    + [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    + ["actions: [{action_id: a, action_type: noop, outputs: {k: *l8}}]"]
)


class Recorder:
    """A real HTTP server that records every request it gets; `/redirect` answers 302 to `target`."""

    def __init__(self, target: str = "") -> None:
        self.hits: list[tuple[str, str | None]] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.hits.append((self.path, self.headers.get("Host")))
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "5")
                self.end_headers()
                self.wfile.write(b"hello")

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
