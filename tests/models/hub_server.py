"""A local stand-in for the Hugging Face Hub's file endpoint, so pull tests never touch the network.

    HEAD/GET /{repo}/resolve/{revision}/{file}   answered as the Hub does: X-Repo-Commit, ETag
                                                 (the file's SHA-256, as for LFS files),
                                                 Content-Length, byte ranges (206 / 416)
    with `cdn` set: the resolve endpoint answers 302 to a second server (another origin, as the
    Hub's CDN is) with X-Linked-Etag / X-Linked-Size, and the bytes come from there.

Hostile answers for the pull's bounds: `overlong` bytes appended to each GET body (announced in
Content-Length, or with `overlong_unannounced` no Content-Length at all, the body ending when the
connection closes), and `stall_after`: the next GET sends that many bytes, then one byte per
`drip_s` seconds (slow enough to fail a rate floor, never silent long enough for a read timeout).

Every request is recorded (method, path, Range, Authorization, status, bytes sent) so tests can
assert what the client asked for and what it was given.
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int
    sent: int = 0


@dataclass
class HubState:
    files: dict[str, bytes] = field(default_factory=dict)  # "repo/revision/file" -> bytes
    token: str | None = None  # when set, requests without "Bearer <token>" get 401
    etag_override: str | None = None  # a wrong SHA-256 to report
    cut_after: int | None = None  # the next GET closes the connection after this many body bytes
    down_after_cut: bool = False  # after that cut, GETs are dropped unanswered (the network is gone)
    down: bool = False
    ignore_range: bool = False
    cdn_base: str | None = None
    overlong: bytes = b""
    overlong_unannounced: bool = False
    stall_after: int | None = None
    drip_s: float = 0.05
    log: list[Seen] = field(default_factory=list)

    def add(self, repo: str, filename: str, data: bytes, revision: str = "main") -> None:
        self.files[f"{repo}/{revision}/{filename}"] = data

    def gets(self) -> list[Seen]:
        return [s for s in self.log if s.method == "GET" and s.status in (200, 206)]


class _Handler(BaseHTTPRequestHandler):
    state: HubState
    role: str  # "hub" | "cdn"

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _record(self, status: int, sent: int = 0) -> None:
        self.state.log.append(Seen(self.command, self.path, self.headers.get("Range"),
                                   self.headers.get("Authorization"), status, sent))

    def _status_only(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self._record(status)

    def _answer(self, *, body: bool) -> None:
        st = self.state
        if body and st.down:
            self.close_connection = True  # no status line at all: the client sees a dropped connection
            return self._record(0)
        if self.role == "cdn":
            key = self.path[len("/cdn/"):]
        else:
            m = re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", self.path)
            if not m:
                return self._status_only(404, {"X-Error-Code": "RepoNotFound"})
            if st.token and self.headers.get("Authorization") != f"Bearer {st.token}":
                return self._status_only(401, {"X-Error-Message": "Invalid credentials in Authorization header"})
            key = f"{m.group(1)}/{m.group(2)}/{m.group(3)}"
        data = st.files.get(key)
        if data is None:
            return self._status_only(404, {"X-Error-Code": "EntryNotFound"})
        sha = st.etag_override or hashlib.sha256(data).hexdigest()
        if self.role == "hub" and st.cdn_base:
            return self._status_only(302, {"Location": f"{st.cdn_base}/cdn/{key}", "X-Repo-Commit": COMMIT,
                                           "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and not st.ignore_range:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
            if start >= len(data):
                return self._status_only(416, {"Content-Range": f"bytes */{len(data)}"})
            status = 206
        rest = data[start:]
        if body:
            rest += st.overlong
        self.send_response(status)
        if not (body and st.overlong and st.overlong_unannounced):
            self.send_header("Content-Length", str(len(rest)))
        self.send_header("ETag", f'"{sha}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return self._record(status)
        cut, st.cut_after = st.cut_after, None
        payload = rest if cut is None else rest[:cut]
        stall, st.stall_after = st.stall_after, None
        if stall is not None:
            return self._drip(status, payload, stall)
        self.wfile.write(payload)
        self.wfile.flush()
        self._record(status, len(payload))
        if cut is not None:
            st.down = st.down_after_cut
            self.close_connection = True  # fewer bytes than Content-Length: a dropped connection


    def _drip(self, status: int, payload: bytes, fast: int) -> None:
        import time

        self.wfile.write(payload[:fast])
        self.wfile.flush()
        sent = fast
        try:
            while sent < len(payload):
                time.sleep(self.state.drip_s)
                self.wfile.write(payload[sent:sent + 1])
                self.wfile.flush()
                sent += 1
        except OSError:  # the client gave up and closed the connection
            pass
        self._record(status, sent)
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A client that drops the connection mid-body (the pull tests' disk-full and interrupted
        # downloads) is expected: socketserver would print its traceback to stderr, where the
        # tests read the CLI's own output, depending on whether the client closed before the
        # last write. Anything else is still printed.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class HubServer:
    """Start with `with HubServer(state, cdn=False) as hub:`; hub.url is the HF_ENDPOINT."""

    def __init__(self, state: HubState, *, cdn: bool = False) -> None:
        self.state = state
        self._servers = [self._make("hub")]
        if cdn:
            cdn_server = self._make("cdn")
            self._servers.append(cdn_server)
            state.cdn_base = f"http://127.0.0.1:{cdn_server.server_address[1]}"
        self.url = f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    def _make(self, role: str) -> _Server:
        handler = type(f"{role}Handler", (_Handler,), {"state": self.state, "role": role})
        return _Server(("127.0.0.1", 0), handler)

    def __enter__(self) -> HubServer:
        for s in self._servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()
