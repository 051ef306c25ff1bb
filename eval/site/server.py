"""`eval view --serve`: the built site on 127.0.0.1, to the page it printed only.

A page of any other site the operator visits can send requests to 127.0.0.1, and, after DNS
rebinding, read their answers; so the address holds a token drawn for the run (a request without
it is answered 404), a request whose `Host` is not this server's is answered 421, and every
answer says `Cross-Origin-Resource-Policy: same-origin`. A picture not drawn at build time is
drawn on its first request and kept.
"""

from __future__ import annotations

import hmac
import secrets
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from eval.site.pictures import draw


class _Handler(SimpleHTTPRequestHandler):
    """The site's files, to the page `serve` printed only: a request must name the run's token
    as the first part of its path and a `Host` of this server's own (`127.0.0.1:PORT`,
    `localhost:PORT`); no folder is listed."""

    token = ""
    lazy: dict = {}
    site = Path()

    def _admit(self) -> bool:
        port = self.server.server_address[1]
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in (f"127.0.0.1:{port}", f"localhost:{port}"):
            # another name for this address: a page of another site after DNS rebinding
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST,
                            "this server answers only to 127.0.0.1 and localhost")
            return False
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        prefix = f"/{self.token}/"
        if not hmac.compare_digest(path[:len(prefix)].encode(), prefix.encode()):
            self.send_error(HTTPStatus.NOT_FOUND)
            return False
        self.path = "/" + path[len(prefix):]
        return True

    def do_GET(self) -> None:
        if not self._admit():
            return
        rel = self.path.lstrip("/")
        if rel in self.lazy and not (self.site / rel).exists():
            try:
                draw(*self.lazy[rel], self.site / rel)
            except ValueError as exc:
                self.send_error(500, f"the episode does not replay: {exc}")
                return
        super().do_GET()

    def do_HEAD(self) -> None:
        if self._admit():
            super().do_HEAD()

    def list_directory(self, path):
        self.send_error(HTTPStatus.NOT_FOUND)
        return None

    def end_headers(self) -> None:
        # no other origin may load a file (a script tag of another page), nor the token leak
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:
        pass


def serve(site: Path, port: int, lazy: dict, private: bool = False) -> None:
    """Serve `site` on 127.0.0.1 until interrupted, drawing a picture not yet drawn on its
    first request, to whoever holds the address it prints: its path starts with a token drawn
    for this run, and any request without it (another web page the operator visits, which
    cannot know it) is answered 404, any for another host name 421."""
    handler = type("Handler", (_Handler,), {"token": secrets.token_urlsafe(24), "lazy": lazy,
                                            "site": site})
    server = ThreadingHTTPServer(("127.0.0.1", port), partial(handler, directory=str(site)))
    print(f"serving {site} at http://127.0.0.1:{server.server_address[1]}/{handler.token}/"
          "index.html (Ctrl-C to stop; the address holds a token made for this run: without "
          "it a request is refused)", flush=True)
    if private:
        print("the site holds runs of the private split: whoever has this address can read "
              "them; do not share it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

