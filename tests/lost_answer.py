"""A lost acknowledgement, for real: a TCP proxy in front of a test object store (SeaweedFS) that passes every
request through and, for a request it was told to pick, lets the request reach the server whole and swallows the
server's answer. The change is made; the client hears nothing, waits until its timeout and then decides (retries,
gives up) exactly as it would against AWS when an answer is lost on the way back.

The proxy reads the client's side as HTTP/1.1 requests (a head, then a body of ``Content-Length`` bytes or chunks)
so that it knows which request each byte belongs to; the server's side is relayed as bytes until a picked request
has gone through, after which that connection's answers go nowhere until the client closes it.
"""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Callable

LOG_PUT = r"^PUT \S*/_delta_log/\d{20}\.json"  # a commit: the PUT of a log entry


@dataclass
class Rule:
    """Swallow the answers to the next ``count`` requests whose request line (``"PUT /bucket/key HTTP/1.1"``)
    matches ``pattern``; ``then_silent``: every answer after the last of them."""

    pattern: re.Pattern[str]
    count: int
    then_silent: bool = False


@dataclass
class LostAnswerProxy:
    """The proxy on ``127.0.0.1:port`` in front of ``upstream`` (host, port). ``swallowed`` lists the request lines
    whose answers it swallowed; ``answered`` is set once the server has answered the last of them (the change was
    made) and ``on_swallow`` (if set) runs then, on the proxy's thread, before the client hears anything."""

    upstream: tuple[str, int]
    port: int = 0
    swallowed: list[str] = field(default_factory=list)
    answered: threading.Event = field(default_factory=threading.Event)
    on_swallow: Callable[[str], None] | None = None
    _rules: list[Rule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LostAnswerProxy:
        server = socket.create_server(("127.0.0.1", self.port))
        self.port = server.getsockname()[1]
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name="lost-answer-accept").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        with self._lock:
            for s in self._sockets:
                _close(s)

    def swallow(self, pattern: str = LOG_PUT, count: int = 1, *, then_silent: bool = False) -> None:
        """Swallow the answers to the next ``count`` requests matching ``pattern`` (a regex over the request line);
        ``then_silent``: from the moment the last of them is sent on, every answer (the store says nothing at all,
        however long the server takes to answer the picked request)."""
        with self._lock:
            self.answered.clear()
            self._rules.append(Rule(re.compile(pattern), count, then_silent))

    def release(self) -> None:
        """Swallow nothing more (answers on connections already muted stay lost)."""
        with self._lock:
            self._rules.clear()

    def _pick(self, request_line: str) -> bool:
        with self._lock:
            for rule in self._rules:
                if rule.count > 0 and rule.pattern.search(request_line):
                    rule.count -= 1
                    self.swallowed.append(request_line)
                    if rule.then_silent and rule.count == 0:
                        self._rules.append(Rule(re.compile("."), 10**9))
                    return True
        return False

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets += [client, server]
            link = _Link(self, client, server)
            threading.Thread(target=link.requests, daemon=True, name="lost-answer-requests").start()
            threading.Thread(target=link.answers, daemon=True, name="lost-answer-answers").start()


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, proxy: LostAnswerProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.mute = threading.Event()  # set once a picked request went through: answers are swallowed from then on
        self.picked = ""

    def requests(self) -> None:
        """Client to server, request by request."""
        reader = _Reader(self.client)
        try:
            while True:
                head = reader.until(b"\r\n\r\n")
                if head is None:
                    break
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                picked = self.proxy._pick(line)
                self.server.sendall(head)
                for piece in _body(reader, head):
                    self.server.sendall(piece)
                if picked:
                    self.picked = line
                    self.mute.set()
        except OSError:
            pass
        finally:  # the client is gone (or muted and gave up): so is its server connection
            _close(self.server)
            _close(self.client)

    def answers(self) -> None:
        """Server to client, as bytes; once muted, read and dropped (the server did answer: the change is made)."""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                if self.mute.is_set():
                    if not self.proxy.answered.is_set():
                        if self.proxy.on_swallow is not None:
                            self.proxy.on_swallow(self.picked)
                        self.proxy.answered.set()
                    continue
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            if not self.mute.is_set():
                _close(self.client)


class _Reader:
    """Buffered reads from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def until(self, marker: bytes) -> bytes | None:
        """Bytes up to and including ``marker``; None at the end of the stream."""
        while marker not in self.buf:
            if not self._fill():
                return None
        end = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise OSError("client closed mid-body")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _body(reader: _Reader, head: bytes) -> list[bytes]:
    """The body after ``head``: ``Content-Length`` bytes, or chunks up to the last one (and its trailers)."""
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (h.partition(b":") for h in head.split(b"\r\n")[1:] if b":" in h)}
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        pieces = []
        while True:
            size_line = reader.until(b"\r\n")
            if size_line is None:
                raise OSError("client closed mid-chunk")
            pieces.append(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers, up to an empty line
                    trailer = reader.until(b"\r\n")
                    if trailer is None:
                        raise OSError("client closed mid-trailer")
                    pieces.append(trailer)
                    if trailer == b"\r\n":
                        return pieces
            pieces.append(reader.exactly(size + 2))
    length = int(headers.get(b"content-length", b"0") or 0)
    return [reader.exactly(length)] if length else []


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
