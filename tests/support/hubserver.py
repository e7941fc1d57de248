"""A small Hugging Face Hub on 127.0.0.1, for the ``hf://`` tests: two threaded HTTP servers.

The *Hub* answers what hydrax asks of huggingface.co:

- ``GET /api/{datasets|models}/ORG/NAME/revision/REV``: ``{"id", "sha", "private"}``;
- ``GET /api/{datasets|models}/ORG/NAME/tree/REV[/PATH]?recursive=true``: files and folders,
  :attr:`HubServer.page_size` a page, the next page named by a ``Link: <...>; rel="next"`` header;
- ``GET|HEAD /[datasets/]ORG/NAME/resolve/REV/PATH``: a small ("git") file is served here, with
  ``Range``; an "LFS" file (by default every ``.tar``) is a ``302`` to the *file store* on another
  port, with ``X-Linked-Etag`` (its sha256), ``X-Linked-Size`` and ``X-Repo-Commit``, as the Hub does.

Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) and
``X-Error-Message``. A private repository answers 401 without ``Authorization: Bearer <token>``
or with another token (any request with a wrong token is a 401, as on the Hub). A repository
renamed with :meth:`HubServer.rename` answers every request under its old name with a ``307`` to
the same path under the new one, a relative ``Location``, as the Hub does for renamed repositories.

The *file store* (the CDN) serves ``/blobs/<sha256>?sig=...`` with ``Range`` (refusing, with 403,
URLs signed before :meth:`HubServer.expire_signatures`), unless
:attr:`HubServer.drop_range` makes it answer every request with ``200`` and the whole file (a
proxy that drops ``Range``). Every request to either is logged (:attr:`HubServer.log`), headers
included, so a test can check that the file store never saw the token.

Commits are kept for ever: :meth:`HubServer.commit` makes a new one (the whole tree) and moves a
branch to it, so old commits stay readable, as on the Hub. :meth:`HubServer.fail_next` arms
failures: a status (with ``Retry-After``) or a connection closed without an answer.
:meth:`HubServer.answer_next` makes either server give hostile answers (an :class:`Answer`:
any status and headers, a body longer or shorter than its headers say, endless, chunked, cut).

*Other origins*: :attr:`HubServer.other_url` (127.0.0.1, another port) and
:attr:`HubServer.other6_url` (``[::1]``, when this machine has IPv6) are servers a hostile
redirect may lead to, started on first use. They serve the file store's blobs (without asking for a
signature) and log every request like the others, so that a test can see which origins were sent
the token (:meth:`HubServer.token_origins`).
"""

from __future__ import annotations

import hashlib
import http.server
import itertools
import json
import re
import socket
import socketserver
import threading
import urllib.parse
from dataclasses import dataclass, field


@dataclass
class Repo:
    kind: str  # "datasets" or "models"
    repo_id: str
    private: bool
    branches: dict = field(default_factory=dict)  # name -> sha
    tags: dict = field(default_factory=dict)  # name -> sha
    commits: dict = field(default_factory=dict)  # sha -> {path: (bytes, lfs)}

    def commit_of(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.branches.get(revision) or self.tags.get(revision)


@dataclass
class Logged:
    server: str  # "hub", "cdn", "other" or "other6"
    method: str
    path: str
    headers: dict
    sent: int = 0  # body bytes written to the client (for hostile answers: how much it took before it stopped reading)


@dataclass
class Answer:
    """A scripted answer (see :meth:`HubServer.answer_next`).

    ``body`` is sent ``repeat`` times (a large body without holding it; ``repeat=None``: until the
    client stops reading, or :data:`ENDLESS` bytes); ``length``: the Content-Length sent (``"auto"``:
    the body's true length; None: no Content-Length, the body ends when the connection closes; any
    other value, a lie, as given); ``chunked``: sent with ``Transfer-Encoding: chunked``; ``cut``:
    the connection is closed after this many body bytes.
    """

    status: int
    headers: dict | list = field(default_factory=dict)
    body: bytes = b""
    repeat: int | None = 1
    length: object = "auto"
    chunked: bool = False
    cut: int | None = None


#: The most a body of ``Answer(repeat=None)`` sends: no test waits on a client that reads without end.
ENDLESS = 1 << 30


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, hub: HubServer, role: str, host: str = "127.0.0.1") -> None:
        self.hub = hub
        self.role = role
        self.connections: set[socket.socket] = set()
        self.guard = threading.Lock()
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, 0), _Handler)

    def server_bind(self):
        # http.server looks up the machine's name here (socket.getfqdn), which a test never needs
        # and which can take seconds where DNS is slow.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", self.server_address[1]

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.guard:
            self.server.connections.add(self.connection)

    def finish(self):
        with self.server.guard:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.hub._handle(self, "GET")

    def do_HEAD(self):
        self.server.hub._handle(self, "HEAD")

    def answer(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, str(value))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def scripted(self, answer: Answer, head: bool, logged: Logged) -> None:
        """Send ``answer`` (see :class:`Answer`); the connection is closed afterwards: what a
        hostile answer leaves on it must not be read as the next answer."""
        self.close_connection = True
        self.send_response(answer.status)
        pairs = answer.headers.items() if isinstance(answer.headers, dict) else answer.headers
        for name, value in pairs:
            self.send_header(name, str(value))
        repeat = answer.repeat
        if answer.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        if answer.length == "auto" and not answer.chunked and repeat is not None:
            self.send_header("Content-Length", str(len(answer.body) * repeat))
        elif answer.length not in ("auto", None):
            self.send_header("Content-Length", str(answer.length))
        self.send_header("Connection", "close")
        self.end_headers()
        if head:
            return
        limit = ENDLESS if answer.cut is None else answer.cut
        times = itertools.count() if repeat is None else range(repeat)
        try:
            for _ in times:
                piece = answer.body[: max(0, limit - logged.sent)]
                if not piece:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if answer.chunked else piece)
                logged.sent += len(piece)
            if answer.chunked and answer.cut is None:
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            if answer.cut is not None:
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # the client stopped reading and closed the connection: what a bounded reader does
            pass

    def error(self, status: int, code: str, message: str, head: bool = False) -> None:
        body = json.dumps({"error": message}).encode()
        self.answer(status, body, {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer:
    """The Hub and its file store; a context manager (see the module docstring)."""

    def __init__(self, token: str = "hf_test_token", page_size: int = 3) -> None:
        self.token = token
        self.page_size = page_size
        self.drop_range = False
        self.signature = 0  # the file store takes only URLs signed with the current one
        self.repos: dict[tuple[str, str], Repo] = {}
        self.blobs: dict[str, bytes] = {}
        self.log: list[Logged] = []
        self._failures: list[dict] = []
        self._holds: list[dict] = []
        self._answers: list[dict] = []
        self.moved: dict[tuple[str, str], str] = {}  # (kind, old name) -> new name
        self._others: dict[str, tuple[_Server, threading.Thread]] = {}
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._hub = _Server(self, "hub")
        self._cdn = _Server(self, "cdn")
        self._threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True, name=f"hubserver-{s.role}")
                         for s in (self._hub, self._cdn)]
        for thread in self._threads:
            thread.start()

    @property
    def url(self) -> str:
        """The Hub's endpoint (what HF_ENDPOINT names)."""
        return f"http://127.0.0.1:{self._hub.server_port}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_port}"

    @property
    def other_url(self) -> str:
        """A server on another origin (127.0.0.1, another port); see the module docstring."""
        return f"http://127.0.0.1:{self._other('other', '127.0.0.1').server_port}"

    @property
    def other6_url(self) -> str | None:
        """A server on ``[::1]`` (another host than 127.0.0.1), or None without IPv6 here."""
        try:
            return f"http://[::1]:{self._other('other6', '::1').server_port}"
        except OSError:
            return None

    def _other(self, role: str, host: str) -> _Server:
        with self._lock:
            found = self._others.get(role)
            if found is None:
                server = _Server(self, role, host)
                thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name=f"hubserver-{role}")
                thread.start()
                found = self._others[role] = (server, thread)
            return found[0]

    def close(self) -> None:
        with self._lock:
            others = list(self._others.values())
        for server in (self._hub, self._cdn, *(s for s, _ in others)):
            server.shutdown()
            with server.guard:
                for connection in list(server.connections):  # wake the threads waiting on kept-alive connections
                    try:
                        connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            server.server_close()
        for thread in (*self._threads, *(t for _, t in others)):
            thread.join(10)

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the repositories ----------------------------------------------------------------------
    def create(self, repo_id: str, files: dict[str, bytes], *, kind: str = "datasets", private: bool = False) -> str:
        """A repository whose ``main`` holds ``files``; returns the commit."""
        with self._lock:
            self.repos[(kind, repo_id)] = Repo(kind, repo_id, private)
        return self.commit(repo_id, files, kind=kind)

    def commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main", kind: str = "datasets",
               lfs=lambda path: path.endswith(".tar")) -> str:
        """A new commit holding exactly ``files`` (``.tar`` files stored as LFS), ``branch`` moved to it."""
        tree = {}
        for path, data in files.items():
            is_lfs = bool(lfs(path))
            if is_lfs:
                self.blobs[hashlib.sha256(data).hexdigest()] = data
            tree[path] = (data, is_lfs)
        with self._lock:
            repo = self.repos[(kind, repo_id)]
            sha = hashlib.sha1(f"{repo_id}/{next(self._counter)}/{sorted(files)}".encode()).hexdigest()
            repo.commits[sha] = tree
            repo.branches[branch] = sha
        return sha

    def rename(self, old: str, new: str, *, kind: str = "datasets") -> None:
        """Rename the repository ``old`` to ``new``: requests under the old name are redirected."""
        with self._lock:
            repo = self.repos.pop((kind, old))
            repo.repo_id = new
            self.repos[(kind, new)] = repo
            self.moved[(kind, old)] = new

    def tag(self, repo_id: str, name: str, sha: str, *, kind: str = "datasets") -> None:
        with self._lock:
            self.repos[(kind, repo_id)].tags[name] = sha

    def expire_signatures(self) -> None:
        """Every file-store URL the Hub gave so far is refused from now on (403), as expired ones are."""
        self.signature += 1

    def fail_next(self, count: int, *, status: int = 503, retry_after: str | None = None, server: str = "cdn",
                  reset: bool = False, match: str = "") -> None:
        """The next ``count`` requests to ``server`` whose path matches ``match`` fail: ``status``
        (with ``Retry-After``), or, with ``reset``, the connection is closed without an answer."""
        with self._lock:
            self._failures.append({"count": count, "status": status, "retry_after": retry_after, "server": server,
                                   "reset": reset, "match": match})

    def hold(self, count: int, *, timeout: float, server: str = "cdn", match: str = "") -> None:
        """The next ``count`` requests to ``server`` matching ``match`` are each held until all
        ``count`` have arrived: they pass only if the client has that many in flight at once
        (else, after ``timeout`` seconds, they are answered 504)."""
        with self._lock:
            self._holds.append({"count": count, "server": server, "match": match,
                                "barrier": threading.Barrier(count, timeout=timeout)})

    def answer_next(self, count: int | None, answer, *, server: str = "hub", match: str = "") -> None:
        """The next ``count`` requests (all, for None) to ``server`` whose path matches ``match``
        get ``answer``: an :class:`Answer`, or a function of the :class:`Logged` request that
        returns one (or None: that request is served as usual, and not counted). The answer armed
        last is given first."""
        with self._lock:
            self._answers.append({"count": count, "answer": answer, "server": server, "match": match})

    def clear_answers(self) -> None:
        """Disarm every :meth:`answer_next`."""
        with self._lock:
            self._answers.clear()

    def token_origins(self) -> set[str]:
        """``"ROLE HOST"`` (the Host header) of every request that carried an ``Authorization`` header."""
        with self._lock:
            return {f"{r.server} {r.headers.get('Host')}" for r in self.log if "Authorization" in r.headers}

    def requests(self, server: str | None = None, pattern: str = "", method: str | None = None) -> list[Logged]:
        """The logged requests to ``server`` (both when None) whose path matches ``pattern``."""
        with self._lock:
            return [r for r in self.log if (server is None or r.server == server) and re.search(pattern, r.path)
                    and (method is None or r.method == method)]

    # -- requests --------------------------------------------------------------------------------
    def _handle(self, handler: _Handler, method: str) -> None:
        role = handler.server.role
        logged = Logged(role, method, handler.path, dict(handler.headers.items()))
        with self._lock:
            self.log.append(logged)
            scripts = [a for a in reversed(self._answers)  # the latest armed first
                       if a["server"] == role and a["count"] != 0 and re.search(a["match"], handler.path)]
        for script in scripts:
            answer = script["answer"](logged) if callable(script["answer"]) else script["answer"]
            if answer is not None:
                with self._lock:
                    if script["count"] is not None:
                        script["count"] -= 1
                return handler.scripted(answer, method == "HEAD", logged)
        with self._lock:
            failure = next((f for f in self._failures if f["server"] == role and f["count"] > 0
                            and re.search(f["match"], handler.path)), None)
            if failure is not None:
                failure["count"] -= 1
            held = next((h for h in self._holds if h["server"] == role and h["count"] > 0 and re.search(h["match"], handler.path)), None)
            if held is not None:
                held["count"] -= 1
        if held is not None:
            try:
                held["barrier"].wait()
            except threading.BrokenBarrierError:
                return handler.answer(504, b"held alone", {}, method == "HEAD")
        if failure is not None:
            if failure["reset"]:
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)  # no answer at all: the client sees the connection drop
                return
            headers = {"Retry-After": failure["retry_after"]} if failure["retry_after"] is not None else {}
            handler.answer(failure["status"], b"busy", headers, method == "HEAD")
            return
        if role != "hub":
            self._serve_blob(handler, method)
        else:
            self._serve_hub(handler, method)

    def _serve_hub(self, handler: _Handler, method: str) -> None:
        split = urllib.parse.urlsplit(handler.path)
        parts = split.path.strip("/").split("/")
        head = method == "HEAD"
        api = parts[0] == "api"
        if api:
            parts = parts[1:]
        kind = parts[0] if parts and parts[0] in ("datasets", "models") else "models"
        if parts and parts[0] in ("datasets", "models") and (api or parts[0] == "datasets"):
            parts = parts[1:]
        if len(parts) < 4:
            return handler.error(404, "NotFound", "no such route", head)
        repo_id, action = "/".join(parts[:2]), parts[2]
        if (kind, repo_id) in self.moved:  # renamed: the same request under the new name
            where = ("/api/" + kind if api else "/datasets" if kind == "datasets" else "") + "/" + self.moved[(kind, repo_id)]
            location = where + "/" + "/".join(parts[2:]) + (f"?{split.query}" if split.query else "")
            return handler.answer(307, f"Temporary Redirect. Redirecting to {location}".encode(), {"Location": location}, head)
        revision = urllib.parse.unquote(parts[3])
        path = urllib.parse.unquote("/".join(parts[4:]))
        repo = self.repos.get((kind, repo_id))
        if not self._allowed(handler, repo, head):
            return
        sha = repo.commit_of(revision)
        if sha is None:
            return handler.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        if api and action == "revision":
            return handler.answer(200, json.dumps({"id": repo_id, "sha": sha, "private": repo.private}).encode(),
                                  {"Content-Type": "application/json"}, head)
        if api and action == "tree":
            return self._tree(handler, repo, sha, path, urllib.parse.parse_qs(split.query), head)
        if not api and action == "resolve":
            return self._resolve(handler, repo, sha, path, head)
        handler.error(404, "NotFound", "no such route", head)

    def _allowed(self, handler: _Handler, repo: Repo | None, head: bool) -> bool:
        given = handler.headers.get("Authorization")
        if given is not None and given != f"Bearer {self.token}":
            handler.error(401, "Unauthorized", "Invalid credentials in Authorization header", head)
            return False
        if repo is None or (repo.private and given is None):
            status = 401 if given is None else 404
            handler.error(status, "RepoNotFound", "Repository not found", head)
            return False
        return True

    def _tree(self, handler: _Handler, repo: Repo, sha: str, folder: str, query: dict, head: bool) -> None:
        files = repo.commits[sha]
        recursive = query.get("recursive", ["false"])[0] == "true"
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in files):
            return handler.error(404, "EntryNotFound", f"{folder} does not exist on {sha}", head)
        entries: dict[str, dict] = {}
        for path, (data, is_lfs) in files.items():
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):].split("/")
            for depth in range(1, len(rest)):  # the folders on the way
                if recursive or depth == 1:
                    name = prefix + "/".join(rest[:depth])
                    entries.setdefault(name, {"type": "directory", "oid": git_blob_id(name.encode()), "size": 0, "path": name})
            if recursive or len(rest) == 1:
                entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
                if is_lfs:
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries[path] = entry
        listing = [entries[name] for name in sorted(entries)]
        cursor = int(query.get("cursor", ["0"])[0])
        page = listing[cursor : cursor + self.page_size]
        headers = {"Content-Type": "application/json"}
        if cursor + self.page_size < len(listing):
            following = urllib.parse.urlencode({**{k: v[0] for k, v in query.items()}, "cursor": cursor + self.page_size})
            headers["Link"] = f'<{self.url}{urllib.parse.urlsplit(handler.path).path}?{following}>; rel="next"'
        handler.answer(200, json.dumps(page).encode(), headers, head)

    def _resolve(self, handler: _Handler, repo: Repo, sha: str, path: str, head: bool) -> None:
        found = repo.commits[sha].get(path)
        if found is None:
            return handler.error(404, "EntryNotFound", f"{path} does not exist on {sha}", head)
        data, is_lfs = found
        if is_lfs:
            digest = hashlib.sha256(data).hexdigest()
            return handler.answer(302, b"", {"Location": f"{self.cdn_url}/blobs/{digest}?sig=s{self.signature}", "X-Repo-Commit": sha,
                                             "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": len(data),
                                             "ETag": f'"{git_blob_id(data)}"'}, head)
        self._ranged(handler, data, {"X-Repo-Commit": sha, "ETag": f'"{git_blob_id(data)}"'}, head, honour_range=True)

    def _serve_blob(self, handler: _Handler, method: str) -> None:
        split = urllib.parse.urlsplit(handler.path)
        digest = split.path.rsplit("/", 1)[-1]
        data = self.blobs.get(digest)
        signed = handler.server.role != "cdn" or f"sig=s{self.signature}" == split.query  # other origins ask for none
        if data is None or not signed:
            return handler.error(403, "AccessDenied", "Request has expired", method == "HEAD")
        self._ranged(handler, data, {"ETag": f'"cdn-{digest[:16]}"'}, method == "HEAD", honour_range=not self.drop_range)

    def _ranged(self, handler: _Handler, data: bytes, headers: dict, head: bool, honour_range: bool) -> None:
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", handler.headers.get("Range", "")) if honour_range else None
        if match is None:
            return handler.answer(200, data, headers, head)
        start = int(match.group(1))
        end = min(len(data), int(match.group(2)) + 1) if match.group(2) else len(data)
        if start >= len(data):
            return handler.answer(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
        handler.answer(206, data[start:end], {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}, head)
