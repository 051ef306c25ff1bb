"""The HTTP side of `tests/model/chat_server.py`: the handler that answers each request with the
scripted model's reply (`ChatServer`'s), or with the fault its `faults` hook asked for (an error
status, a dropped connection, an unreadable body, a stall, a trickle, a flood), or with what its
`rewrite` hook made of the reply. A test helper, not a test module."""

from __future__ import annotations

import json
import socket
import socketserver
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Mapping

from tests.model.chat_script import HTTPError, error_kind

if TYPE_CHECKING:
    from tests.model.chat_server import ChatServer, Fault

FLOOD_CHUNK = 1 << 20
GARBAGE = b'{"choices": [ this is not json'


def _flood_parts(head: bytes, size: int, tail: bytes, gzip: bool):
    """`head`, `size` bytes of padding, `tail`, in 1 MiB pieces, made as they are sent (a
    flood of hundreds of MB never sits in the server's memory); gzip-compressed if asked."""
    def plain():
        yield head
        left = size
        chunk = b"a" * FLOOD_CHUNK
        while left > 0:
            yield chunk[:left]
            left -= len(chunk)
        yield tail

    if not gzip:
        yield from plain()
        return
    import zlib
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for part in plain():
        packed = packer.compress(part)
        if packed:
            yield packed
    yield packer.flush()


class ChatHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    chat: ChatServer

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a DNS lookup); not needed here
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away (a timeout, a drop) is not an error of the server


class ChatHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-chat/1.0"
    sys_version = ""
    disable_nagle_algorithm = True
    wbufsize = -1  # headers and body leave in one write; handle_one_request flushes

    def setup(self) -> None:
        super().setup()
        chat = self.server.chat
        with chat._lock:
            chat._connections.add(self.connection)

    def finish(self) -> None:
        chat = self.server.chat
        with chat._lock:
            chat._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format, *args) -> None:
        pass

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, payload: bytes, headers: Mapping[str, str] = {},
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, str(value))
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, data: dict, headers: Mapping[str, str] = {}) -> None:
        self._send(status, json.dumps(data).encode(), headers)

    def do_GET(self) -> None:
        self._read_body()
        if self._path() != "/v1/models":
            self._not_found()
            return
        try:
            self._send_json(200, self.server.chat._models(self.headers.get("Authorization")))
        except HTTPError as exc:
            self._send_json(exc.status, exc.body())

    def do_POST(self) -> None:
        raw = self._read_body()
        if self._path() != "/v1/chat/completions":
            self._not_found()
            return
        chat: ChatServer = self.server.chat
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                body = {}
        except ValueError:
            body = {}
        n = chat._count(body)
        fault = chat.faults(n, body) if chat.faults is not None else None
        if fault is not None:
            if fault.kind == "drop":
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if fault.kind == "garbage":
                self._send(200, GARBAGE)
                return
            if fault.kind == "status":
                type_, code = error_kind(fault.status)
                message = fault.message or f"injected fault: HTTP {fault.status}"
                self._send_json(fault.status, HTTPError(fault.status, message, type_, code).body(),
                                fault.headers)
                return
            if fault.kind in ("trickle", "trickle_head"):
                self._trickle(fault)
                return
            if fault.kind == "flood":
                self._flood(chat, n, body, fault)
                return
            chat._closing.wait(fault.seconds)  # stall, then answer normally
        try:
            data = chat._complete(n, body, self.headers.get("Authorization"))
        except HTTPError as exc:
            self._send_json(exc.status, exc.body())
        except Exception as exc:  # a bug here or in a hook: say so rather than hang the client
            text = "".join(traceback.format_exception(exc))
            with chat._lock:
                chat.errors.append(text)
            self._send_json(500, HTTPError(500, f"scripted model failed: {exc!r}",
                                            "server_error").body())
        else:
            if chat.rewrite is not None:
                try:
                    replaced = chat.rewrite(n, body, data)
                except Exception as exc:  # a bug in the hook: say so, as above
                    with chat._lock:
                        chat.errors.append("".join(traceback.format_exception(exc)))
                    self._send_json(500, HTTPError(500, f"rewrite failed: {exc!r}",
                                                    "server_error").body())
                    return
                if isinstance(replaced, bytes):
                    self._send(200, replaced)
                    return
                if replaced is not None:
                    data = replaced
            self._send_json(200, data)

    def _trickle(self, fault: Fault) -> None:
        """Headers (or, for `trickle_head`, not even all of them), then a byte every
        `fault.seconds`: at most `fault.size` bytes, until the client goes or the server
        closes."""
        self.close_connection = True
        chat: ChatServer = self.server.chat
        if fault.kind == "trickle":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(fault.size))
            self.end_headers()
            drip = b" " * fault.size  # JSON's leading whitespace: a valid prefix of a body
        else:
            drip = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: "
                    + b"a" * fault.size)[:fault.size]
        try:
            self.wfile.flush()
            for i in range(len(drip)):
                self.wfile.write(drip[i:i + 1])
                self.wfile.flush()
                if chat._closing.wait(fault.seconds):
                    return
        except OSError:  # the client went away: what it should do
            return

    def _flood(self, chat: "ChatServer", n: int, body: dict, fault: Fault) -> None:
        """The answer with `fault.size` bytes of padding in it, streamed."""
        self.close_connection = True
        marker = "\u0000PADDING\u0000"
        if fault.status == 200:
            try:
                data = chat._complete(n, body, self.headers.get("Authorization"))
            except HTTPError as exc:
                self._send_json(exc.status, exc.body())
                return
            data["choices"][0]["message"]["content"] = marker
        else:
            type_, code = error_kind(fault.status)
            data = HTTPError(fault.status, marker, type_, code).body()
        head, tail = json.dumps(data).encode().split(json.dumps(marker).encode())
        gzip = dict(fault.headers).get("Content-Encoding") == "gzip"
        parts = _flood_parts(head + b'"', fault.size, b'"' + tail, gzip)
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/json")
        for name, value in fault.headers.items():
            self.send_header(name, str(value))
        if gzip:  # no Content-Length: the body ends when the connection does
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(len(head) + fault.size + len(tail) + 2))
        self.end_headers()
        try:
            for part in parts:
                if chat._closing.is_set():
                    return
                self.wfile.write(part)
            self.wfile.flush()
        except OSError:  # the client stopped reading and closed: what it should do
            return

    def _not_found(self) -> None:
        self._send_json(404, HTTPError(404, f"Invalid URL ({self.command} {self.path})").body())
