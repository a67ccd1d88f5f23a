"""A loopback HTTP server that is slow on purpose, for the deadline tests.

Modes (one per server, any path, GET or POST):
  trickle          status line and headers at once (with the full Content-Length), then the body one
                   byte every `pace` seconds: each read sees data long before a per-read timeout
  trickle_headers  the status line and headers themselves one byte every `pace` seconds
  silent           status line and headers, then nothing until the client leaves or the server stops
  ok               the whole response at once
  endless          no Content-Length, then `body` repeated as fast as the client reads, for ever
  redirect         302 to `body` (a URL, e.g. file:///etc/passwd)
  bad_gzip         `Content-Encoding: gzip` on a body that is not gzip
  truncated        chunked transfer: one chunk of half the body, then the connection closes
With `tls` (a server-side SSLContext) it speaks HTTPS. Each connection has its own thread; `active` counts responses being sent slowly right now, so a test
can wait until a slow read is really pending, and `left_early` counts clients that went away first.
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import Optional


class HostileServer:
    def __init__(self, body: str | bytes, mode: str = "trickle", pace: float = 0.25,
                 content_type: str = "text/plain; version=0.0.4; charset=utf-8",
                 tls: Optional[ssl.SSLContext] = None):
        if mode not in ("trickle", "trickle_headers", "silent", "ok", "endless", "redirect", "bad_gzip", "truncated"):
            raise ValueError(f"unknown mode {mode!r}")
        self.body = body.encode() if isinstance(body, str) else body
        self.mode = mode
        self.pace = pace
        self.content_type = content_type
        self.tls = tls  # a server-side context: HTTPS, handshake done in the connection's thread
        self.requests: list[tuple[str, str]] = []  # (method, path) in arrival order
        self.arrivals: list[float] = []  # time.monotonic() of each request (one clock for the machine)
        self.active = 0
        self.left_early = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="hostile-accept", daemon=True)
        self._thread.start()

    def url(self, path: str = "/metrics") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="hostile-conn", daemon=True).start()

    def _read_request(self, conn: socket.socket) -> bool:
        conn.settimeout(5.0)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = (lines[0].split(" ") + ["", ""])[:2]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            rest += chunk
        with self._lock:
            self.requests.append((method, path.split("?")[0]))
            self.arrivals.append(time.monotonic())
        return True

    def _gone(self, conn: socket.socket) -> bool:
        """The client closed its end (it sends nothing more after its request)."""
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        if isinstance(conn, ssl.SSLSocket):  # no MSG_PEEK over TLS: read what came (close_notify or EOF)
            conn.settimeout(0.01)
            try:
                return conn.recv(1) == b""
            except (socket.timeout, ssl.SSLWantReadError):
                return False
            except OSError:
                return True
            finally:
                conn.settimeout(5.0)
        try:
            return conn.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _slowly(self, conn: socket.socket, data: bytes) -> bool:
        for i in range(len(data)):
            if self._stop.wait(self.pace) or self._gone(conn):
                return False
            conn.sendall(data[i:i + 1])
            with self._lock:
                self.bytes_sent += 1
        return True

    def _serve(self, conn: socket.socket) -> None:
        finished = True
        try:
            if self.tls is not None:
                conn.settimeout(5.0)
                conn = self.tls.wrap_socket(conn, server_side=True)
            if not self._read_request(conn):
                return
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: {self.content_type}\r\n"
                    f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n").encode()
            if self.mode == "ok":
                conn.sendall(head + self.body)
                return
            if self.mode in ("redirect", "bad_gzip", "truncated", "endless"):
                if not self._odd(conn) and not self._stop.is_set():
                    with self._lock:
                        self.left_early += 1
                return
            with self._lock:
                self.active += 1
            try:
                if self.mode == "trickle_headers":
                    finished = self._slowly(conn, head + self.body)
                else:
                    conn.sendall(head)
                    if self.mode == "trickle":
                        finished = self._slowly(conn, self.body)
                    else:
                        while not self._stop.wait(0.05):
                            if self._gone(conn):
                                finished = False
                                break
            finally:
                with self._lock:
                    self.active -= 1
                    if not finished and not self._stop.is_set():
                        self.left_early += 1
        except OSError:
            with self._lock:
                self.left_early += 1
        finally:
            conn.close()

    def _odd(self, conn: socket.socket) -> bool:
        """The responses that are wrong in their framing or headers, not in their pace."""
        ctype = f"Content-Type: {self.content_type}\r\n"
        if self.mode == "redirect":
            conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {self.body.decode()}\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n".encode())
        elif self.mode == "bad_gzip":
            conn.sendall(f"HTTP/1.1 200 OK\r\n{ctype}Content-Encoding: gzip\r\nContent-Length: {len(self.body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + self.body)
        elif self.mode == "truncated":
            half = self.body[:len(self.body) // 2]
            conn.sendall(f"HTTP/1.1 200 OK\r\n{ctype}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                         .encode() + f"{len(half):x}\r\n".encode() + half + b"\r\n")
        else:  # endless
            conn.sendall(f"HTTP/1.1 200 OK\r\n{ctype}Connection: close\r\n\r\n".encode())
            block = self.body * max(1, (256 * 1024) // max(1, len(self.body)))
            with self._lock:
                self.active += 1
            try:
                while not self._stop.is_set():
                    conn.sendall(block)
                    with self._lock:
                        self.bytes_sent += len(block)
            except OSError:
                return False
            finally:
                with self._lock:
                    self.active -= 1
        return True

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)
