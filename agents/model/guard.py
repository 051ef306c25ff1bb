"""An endpoint can neither hang nor flood the run. Each attempt has a wall-clock deadline
(`timeout_s`, `--timeout`) for the whole of it, connecting, sending and reading: a server that
sends its headers and then a byte a second is cut at the deadline, not after a read that never
times out. And it may receive at most `max_response_bytes` (`--max-response-bytes`), headers
and body as they come over the wire (a compressed body is refused, `refuse_compressed`: only
`identity` is asked for, and a compressed size says nothing of what it inflates to). Both are
enforced on the client's connections themselves (`guard` puts `_GuardedBackend` under them:
every connect, write and read of an attempt's connection, in the attempt's thread, gets at most
what is left of its deadline and counts its bytes, while `limited` says what the attempt may
take), so nothing keeps reading past either, no thread is left behind, and the connection is
closed. Either is an endpoint failure like a timeout (`Cut`): retried, then the episode's
`InfrastructureError`."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


class Cut(Exception):
    """An attempt stopped by its own limits (its deadline, its byte cap): an endpoint failure,
    retried like a timeout. Raised inside the client's connection, it passes through httpx and
    the openai client as it is (neither maps an exception it does not know)."""


class _Attempt:
    """One attempt's limits: a wall-clock deadline for all of it, and the bytes it may
    receive."""

    def __init__(self, seconds: float, max_bytes: int, over: str):
        self.seconds, self.max_bytes, self.over = seconds, max_bytes, over
        self.deadline = time.monotonic() + seconds
        self.received = 0

    def late(self) -> Cut:
        return Cut(f"no complete response within the --timeout deadline of {self.seconds:g} s "
                   "(a deadline for the whole attempt, not for each read)")

    def run(self, operation, timeout: float | None):
        """`operation(timeout)`, its timeout no more than what is left of the deadline; a
        failure at or past the deadline is the deadline's."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.late()
        try:
            return operation(left if timeout is None else min(timeout, left))
        except Exception:
            if time.monotonic() >= self.deadline - 0.01:
                raise self.late() from None
            raise

    def count(self, n: int) -> None:
        self.received += n
        if self.received > self.max_bytes:
            raise Cut(self.over)


_LOCAL = threading.local()  # `attempt`: the attempt this thread is making, if any


@contextmanager
def limited(seconds: float, max_bytes: int, over: str):
    """This thread's requests within the block are one attempt: cut (`Cut`) at `seconds` from
    now or past `max_bytes` received (`over` says which cap that was)."""
    _LOCAL.attempt = _Attempt(seconds, max_bytes, over)
    try:
        yield
    finally:
        _LOCAL.attempt = None


def _guarded(operation, timeout: float | None):
    attempt = getattr(_LOCAL, "attempt", None)
    return operation(timeout) if attempt is None else attempt.run(operation, timeout)


class _GuardedStream:
    """A connection of the client: each read, write and TLS handshake within the current
    attempt's deadline, each byte read counted against its cap. Writes go in pieces, so that a
    server that reads slowly meets the deadline too."""

    PIECE = 1 << 16

    def __init__(self, inner):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        attempt = getattr(_LOCAL, "attempt", None)
        if attempt is None:
            return self._inner.read(max_bytes, timeout)
        data = attempt.run(lambda t: self._inner.read(max_bytes, t), timeout)
        attempt.count(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        for start in range(0, len(view), self.PIECE):
            piece = view[start:start + self.PIECE]
            _guarded(lambda t: self._inner.write(piece, t), timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _GuardedStream(_guarded(
            lambda t: self._inner.start_tls(ssl_context, server_hostname, t), timeout))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _GuardedBackend:
    """The client's network backend, its connections guarded (`_GuardedStream`)."""

    def __init__(self, inner):
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _GuardedStream(_guarded(lambda t: self._inner.connect_tcp(
            host, port, timeout=t, local_address=local_address, socket_options=socket_options),
            timeout))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _GuardedStream(_guarded(lambda t: self._inner.connect_unix_socket(
            path, timeout=t, socket_options=socket_options), timeout))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def guard(http_client) -> None:
    """Put `_GuardedBackend` under every connection pool of the openai client's HTTP client
    (its own, and one per proxy the environment names). httpx lets a pool be given its network
    backend but gives the client's pools no such option, so this sets the pools' attribute;
    a client that does not have one is refused here rather than run without a deadline."""
    transports = [getattr(http_client, "_transport", None),
                  *getattr(http_client, "_mounts", {}).values()]
    for transport in transports:
        if transport is None:  # a pattern that goes without a proxy: the client's own
            continue
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is None:
            raise ImportError(f"this version of the openai client's HTTP library "
                              f"({type(transport).__module__}) keeps its connections where the "
                              "model arm cannot put a deadline on them; install the pinned "
                              "versions (constraints.txt)")
        if not isinstance(backend, _GuardedBackend):
            pool._network_backend = _GuardedBackend(backend)


def refuse_compressed(response) -> None:
    """A response hook: a compressed body is refused (its size on the wire, which the cap
    counts, says nothing of what it inflates to; the request asked for `identity`)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise Cut(f"a compressed body (Content-Encoding {encoding}) though the request asked "
                  "for identity: its size cannot be capped before it is inflated")

