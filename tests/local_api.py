"""A local HTTP server that answers as a remote JSON API would, for the clients of services
that cannot be reached from here (ElectricityMaps, OpenEI, ipinfo)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class LocalApi:
    """A local server answering `GET <path>` with `routes[path]` = (status, JSON body)."""

    def __init__(self) -> None:
        """Start serving on a free port of 127.0.0.1, in a daemon thread."""
        self.routes: dict[str, tuple[int, Any]] = {}
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                api.requests.append((url.path, parse_qs(url.query), dict(self.headers)))
                status, body = api.routes.get(url.path, (404, {"error": "no such path"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()
