"""Fuzzing of the answers the Hugging Face Hub store reads (``hydrax.shards.hub``; issue 38).

The local Hub (``tests/support/hubserver.py``) serves a private dataset; for every mutant, some of
the answers that it, its file store and a server on another origin give are replaced by hostile
ones: random status codes (with ``Retry-After`` and error bodies), redirects whose ``Location`` is
built from a grammar of hostile pieces (backslashes, ``@``, user names, percent-encoding, IPv6,
trailing dots, other ports and schemes, relative forms), ``Content-Range``, ``Content-Length`` and
``X-Linked-Size`` that lie, ``Link`` headers that name their own page, an endless series of
pages or another host, JSON nested past Python's stack, too long, not JSON or of the wrong shape,
and bodies longer than said (up to endless), shorter, chunked or cut.

Each mutant runs one operation on a fresh store: pin a revision, list a folder, stat a file, read
a range, read to the end, read a whole file, read twice (the second time from the file store's
URL kept from the first), stream a range; or one of the first three with the endpoint (an option,
or ``HF_ENDPOINT``) built from the same hostile pieces as the Locations. It must end in success or in one of hydrax's
``StoreError`` classes: never another exception, never a hang (the batch runs in a child under a
time limit), and never the token at another origin than the Hub's (the servers log every request
that carried ``Authorization``, with its ``Host``). A success must hold what was asked for: a range
exactly its bytes' count, a stream its range's count, a revision a commit id, a listing files of
the folder only.

``HYDRAX_FUZZ`` and ``HYDRAX_FUZZ_SEED`` set the mutants and the seed (``tests/support/fuzzing.py``);
a failure names the seed and the mutant; replay with ``python tests/test_fuzz_hub.py SEED FIRST COUNT``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import re
import sys
import threading

import pytest

from support.fuzzing import batches, run_isolated

TOKEN = "hf_fuzz_token"
#: Pages of one listing, and bytes of one API answer, the store follows in the fuzz (smaller than
#: the store's own bounds, so that mutants reach them in milliseconds).
PAGES, API_BYTES = 25, 256 << 10
#: The longest body a hostile answer sends, ``Answer(repeat=None)`` included.
LONGEST = 16 << 20

REDIRECTS = (301, 302, 303, 307, 308)
STATUSES = (100, 102, 199, 200, 204, 206, 299, 300, 304, 305, 399, 400, 401, 403, 404, 405, 410, 416, 418, 429, 500, 502, 503,
            504, 599, 999) + REDIRECTS
SCHEMES = ("http://",) * 6 + ("https://", "HTTP://", "//", "", "ftp://", "file://", "http:", "http:\\\\", "javascript:", "http:/")
USERINFO = ("",) * 6 + ("u@", "u:p@", "{hub_host}@", "{other_host}\\@", "%40@", "@", "hf_x:y@")
HOSTS = ("127.0.0.1",) * 4 + ("127.0.0.1.", "localhost", "[::1]", "[::ffff:127.0.0.1]", "%31%32%37.0.0.1", "127.1", "2130706433",
                              "[::1", "", "127.0.0.1%00", "127.0.0.1\\", "127.0.0.1%2e")
PORTS = (":{hub}", ":{hub}", ":{cdn}", ":{other}", ":{other}", ":{other6}", "", ":", ":99999", ":-1", ":abc", ":0", ":{hub}\\")
TAILS = ("",) * 6 + ("\\@{hub_host}", "\\\\@{hub_host}", "#@{hub_host}", "?@{hub_host}", "@{hub_host}", "%5C@{hub_host}", "\\",
                     "/..\\..@{hub_host}", ":{hub}")
PATHS = ("/blobs/{digest}", "/blobs/{digest}?sig=s0", "/datasets/org/data/resolve/{sha}/data/a.tar",
         "/api/datasets/org/data/revision/main", "/api/datasets/org/data/tree/{sha}/data?recursive=true",
         "/api/datasets/neworg/other/revision/main", "/", "", "/%2e%2e/x", "/\xe9", "/a b", "/x" * 3000, "/\x7f")
RELATIVE = ("/blobs/{digest}", "blobs/{digest}", "../x", "?x", "#x", "", " ", "\\\\{other_host}/blobs/{digest}",
            "//{other_host}/blobs/{digest}", "/datasets/neworg/new/resolve/{sha}/data/a.tar", "/api/datasets/neworg/new/revision/main")
NUMBERS = ("0", "1", "-1", "abc", "\xb2", "1, 2", "9" * 25, "9" * 5000, "", " 5", "5 ", "0x10", "1e3", str(2**62), str(2**64))
RETRY_AFTER = ("0", "1", "nan", "inf", "-inf", "-5", "1e999", "Wed, 21 Oct 2015 07:28:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT",
               "x", "")
ERROR_CODES = ("RepoNotFound", "RevisionNotFound", "EntryNotFound", "GatedRepo", "", "x" * 300)


def json_bodies(sha: str) -> list[bytes]:
    """Answers of the API, hostile to a reader of JSON (and some that are fine)."""
    entry = '{"type": "file", "oid": "%s", "size": 10, "path": "data/x.tar"}' % ("0" * 40)
    return [b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 5000 + b"0" + b"}" * 5000, b"[" * 999 + b"]" * 999,
            b'"' + b"a" * (API_BYTES + 10) + b'"', b"[" + b"1," * (API_BYTES // 2) + b"1]", b"\xff\xfe\x00", b"", b"nul", b"[",
            b"null", b"1e999", b"NaN", b"9" * 5000, b'{"sha": 5}', b'{"sha": "' + b"x" * 40 + b'"}', b'{"sha": "%s"}' % sha.encode(),
            b'{"sha": "%s", "x": ' % sha.encode() + b"[" * 990 + b"]" * 990 + b"}", b"[]", ("[" + entry + "]").encode(),
            b'[{"type": "file", "path": 5, "size": "x"}, {"type": "file", "path": "data/y", "size": -1}, 7, null, []]',
            b'[{"type": "file", "path": "data/../../z", "size": 1e300, "lfs": {"size": 2, "oid": []}}]',
            b'{"error": ' + b"[" * 400 + b"]" * 400 + b"}", b'{"error": "x"}', ("[" + ",".join([entry] * 3000) + "]").encode()]


class Context:
    """What a mutant's answers are built from: the servers' ports and the repository's contents."""

    def __init__(self, server, sha: str, digests: list[str]) -> None:
        self.server, self.sha, self.digests = server, sha, digests
        self.ports = {"hub": server.url.rsplit(":", 1)[1], "cdn": server.cdn_url.rsplit(":", 1)[1],
                      "other": server.other_url.rsplit(":", 1)[1]}
        self.ports["other6"] = server.other6_url.rsplit(":", 1)[1] if server.other6_url else "1"
        self.json = json_bodies(sha)

    def fill(self, text: str, rng: random.Random) -> str:
        return text.format(hub=self.ports["hub"], cdn=self.ports["cdn"], other=self.ports["other"], other6=self.ports["other6"],
                           hub_host=f"127.0.0.1:{self.ports['hub']}", other_host=f"127.0.0.1:{self.ports['other']}",
                           digest=rng.choice(self.digests), sha=self.sha)


def location(rng: random.Random, ctx: Context) -> str:
    """A Location (or Link target) from the grammar: absolute, from hostile pieces, or relative."""
    if rng.random() < 0.25:
        return ctx.fill(rng.choice(RELATIVE), rng)
    pieces = (SCHEMES, USERINFO, HOSTS, PORTS, TAILS, PATHS)
    return ctx.fill("".join(rng.choice(p) for p in pieces), rng)


def body_for(rng: random.Random, n: int, answer_kw: dict) -> None:
    """A body meant to be ``n`` bytes: exactly, shorter, longer, endless; said or lied about."""
    how = rng.choice(("exact", "exact", "short", "long", "huge", "endless", "empty"))
    size = {"exact": n, "short": max(0, n - rng.randint(1, 50)), "long": n + rng.choice((1, 2, 1000)), "empty": 0}.get(how)
    if size is not None:
        answer_kw.update(body=b"\x00" * size, repeat=1)
    else:
        answer_kw.update(body=b"y" * (64 << 10), repeat=None if how == "endless" else rng.choice((16, 64, 256)))
    answer_kw["length"] = rng.choice(("auto", "auto", None, n, n + 1, max(0, n - 1), rng.choice(NUMBERS)))
    answer_kw["chunked"] = rng.random() < 0.25
    if rng.random() < 0.15:
        answer_kw["cut"] = rng.randint(0, max(1, n))


def asked_range(request) -> tuple[int, int | None]:
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", ""))
    if match is None:
        return 0, None
    return int(match.group(1)), int(match.group(2)) if match.group(2) else None


def hostile(rng: random.Random, request, ctx: Context):
    """A hostile answer to ``request`` (see the module docstring)."""
    from support.hubserver import Answer

    headers: list[tuple[str, object]] = []
    kw: dict = {}
    kind = rng.choice(("redirect", "redirect", "range", "whole", "json", "json", "status", "odd"))
    if kind == "redirect":
        status = rng.choice(REDIRECTS)
        for _ in range(rng.choice((1, 1, 1, 0, 2))):
            headers.append(("Location", location(rng, ctx)))
        if rng.random() < 0.3:
            headers.append(("X-Linked-Size", rng.choice(NUMBERS + ("100", "3000"))))
        if rng.random() < 0.2:
            headers.append(("X-Repo-Commit", rng.choice((ctx.sha, "0" * 40, "x"))))
        if rng.random() < 0.2:
            body_for(rng, 10, kw)
    elif kind == "range":
        status = rng.choice((206, 206, 206, 200))
        first, last = asked_range(request)
        last = first + 99 if last is None else last
        total = max(last + 1, 8000)
        ranges = (f"bytes {first}-{last}/{total}", f"bytes {first + 1}-{last}/{total}", f"bytes {first}-{last + 1}/{total}",
                  f"bytes {first}-{max(first, last - 1)}/{total}", f"bytes {first}-{last}/*", f"bytes {first}-{last}/{last}",
                  f"bytes {last}-{first}/{total}", "bytes x-y/z", f"bytes {'9' * 5000}-{'9' * 5001}/*", "bytes -1-5/10", "",
                  f"bytes {first}-{last}/{total}, bytes 0-1/2")
        if rng.random() < 0.9:
            headers.append(("Content-Range", rng.choice(ranges)))
        body_for(rng, last - first + 1, kw)
    elif kind == "whole":
        status = rng.choice((200, 200, 203, 206))
        if rng.random() < 0.3:
            headers.append(("X-Linked-Size", rng.choice(NUMBERS + ("3000", "5000"))))
        if rng.random() < 0.3:
            headers.append(("ETag", rng.choice(('"%s"' % rng.choice(ctx.digests), "W/", '""', "x" * 500))))
        body_for(rng, rng.choice((3000, 5000, 700, 0)), kw)
    elif kind == "json":
        status = rng.choice((200, 200, 200, 404, 500))
        data = rng.choice(ctx.json)
        kw.update(body=data, length=rng.choice(("auto", "auto", None, len(data) + 5, max(0, len(data) - 5), rng.choice(NUMBERS))),
                  chunked=rng.random() < 0.2)
        if rng.random() < 0.1:
            kw["cut"] = rng.randint(0, max(1, len(data)))
        if rng.random() < 0.6:
            here = f"http://127.0.0.1:{ctx.ports['hub']}{request.path}"
            links = (here, here.split("?")[0] + f"?recursive=true&cursor={rng.randint(0, 10**6)}", location(rng, ctx), "", "x",
                     f"http://127.0.0.1:{ctx.ports['other']}{request.path}", "?cursor=2", "//127.0.0.1:" + ctx.ports["cdn"] + "/x")
            rel = rng.choice(('rel="next"', "rel=next", 'rel="prev"', 'rel="next prev"', "", 'rel="next'))
            headers.append(("Link", ", ".join(f"<{rng.choice(links)}>; {rel}" for _ in range(rng.choice((1, 1, 2, 300))))))
        if rng.random() < 0.2:
            headers.append(("X-Error-Code", rng.choice(ERROR_CODES)))
    elif kind == "status":
        status = rng.choice(STATUSES)
        if rng.random() < 0.5:
            headers.append(("Retry-After", rng.choice(RETRY_AFTER)))
        if rng.random() < 0.5:
            headers.append(("X-Error-Code", rng.choice(ERROR_CODES)))
        if rng.random() < 0.3:
            headers.append(("X-Error-Message", rng.choice(("x" * 5000, "\xe9", ""))))
        data = rng.choice((b"", b"busy", b"[" * 1024, b'{"error": ' + b"[" * 1000, b'{"error": {"a": 1}}', b"\xff" * 100))
        kw.update(body=data, length=rng.choice(("auto", None, 10**6)), chunked=rng.random() < 0.2)
    else:
        status = rng.choice((200, 206, 302))
        odd = rng.choice((("Content-Encoding", "gzip"), ("Content-Encoding", "br, identity"), ("Transfer-Encoding", "chunked"),
                          ("Content-Length", "5, 6"), ("Content-Length", "-3"), ("X-Linked-Size", "\xb2"),
                          ("Location", ""), ("Content-Range", "bytes */10")))
        headers.append(odd)
        body_for(rng, 50, kw)
    return Answer(status, headers, **kw)


def plan(rng: random.Random, ctx: Context):
    """The mutant's server-side script: each request is answered with a hostile answer, with a
    probability, until the mutant's budget of them is spent; others are served as usual."""
    budget = [rng.choice((1, 1, 2, 3, 5, 12))]
    chance = rng.choice((0.3, 0.6, 1.0, 1.0))
    lock = threading.Lock()

    def answer(request):
        with lock:
            if budget[0] <= 0 or rng.random() >= chance:
                return None
            budget[0] -= 1
            return hostile(rng, request, ctx)

    return answer


OPERATIONS = ("pin", "list", "stat", "range", "range", "tail", "whole", "twice", "stream", "stream", "endpoint")


def with_endpoint(options, rng: random.Random, ctx: Context):
    """A store whose endpoint (an option, or HF_ENDPOINT) is built from the grammar's pieces; no
    token: it may name any server."""
    from hydrax.shards.hub import HubStore

    endpoint = ctx.fill("".join(rng.choice(p) for p in (SCHEMES, USERINFO, HOSTS, PORTS, TAILS)), rng)
    endpoint += rng.choice(("", "", "/", "/hub", "/x/", "?q=1", "#f", " ", "\n"))
    if rng.random() < 0.5:
        return HubStore(dataclasses.replace(options, endpoint=endpoint, token=""))
    os.environ["HF_ENDPOINT"] = endpoint
    try:
        return HubStore(dataclasses.replace(options, endpoint=None, token=""))
    finally:
        del os.environ["HF_ENDPOINT"]


def operate(store, op: str, rng: random.Random, ctx: Context, files: dict[str, bytes]) -> str:
    """Run ``op`` on ``store``; check what a success returned; return words for the tally."""
    from hydrax.shards.hub.url import COMMIT
    from hydrax.shards.store import run_async

    name = rng.choice(sorted(files))
    data = files[name]
    url = f"hf://datasets/org/data@{ctx.sha}/{name}"
    if op == "endpoint":
        store = with_endpoint(store.options, rng, ctx)
        op = rng.choice(("pin", "stat", "range"))
    if op == "pin":
        sha = store.commit_of(f"hf://datasets/org/data@{rng.choice(('main', 'v1', ctx.sha))}/{name}")
        assert isinstance(sha, str) and COMMIT.fullmatch(sha), sha
    elif op == "list":
        prefix = f"hf://datasets/org/data@{ctx.sha}/data/"
        found = store.list(prefix)
        assert all(info.url.startswith(prefix) and info.size >= 0 for info in found), found[:3]
    elif op == "stat":
        info = store.stat(url)
        assert isinstance(info.size, int) and info.size >= 0
    elif op in ("range", "twice"):
        for _ in range(1 if op == "range" else 2):
            offset = rng.randrange(len(data))
            size = rng.randint(1, len(data) - offset)
            got = store.read(url, offset, size)
            assert len(got) == size, (offset, size, len(got))
    elif op == "tail":
        got = store.read(url, rng.randrange(1, len(data)))
        assert len(got) <= LONGEST
    elif op == "whole":
        assert len(store.read(url)) <= LONGEST
    else:
        start = rng.randrange(len(data) - 1)
        end = rng.randint(start + 1, len(data))

        async def streamed():
            return sum([len(piece) async for piece in store.stream_async(url, start, end)])

        total = run_async(streamed())
        assert total == end - start, (start, end, total)
    return "ok"


def run(seed: int, first: int, count: int) -> None:
    """Check mutants ``first .. first + count`` for ``seed`` (in this process)."""
    from support import hubserver

    from hydrax.errors import StoreError
    from hydrax.shards.hub import HubStore, client as hub_client, store as hub_store
    from hydrax.shards.options import HFOptions

    # Retries at once (a hostile Retry-After would make the fuzz wait, not find anything), and
    # the bounds lowered so that mutants reach them quickly.
    hub_store._pause = lambda seconds: None
    HubStore._wait = lambda self, exc, attempt: 0.0
    hub_store.MAX_PAGES, hub_client.MAX_API_BYTES = PAGES, API_BYTES
    hubserver.ENDLESS = LONGEST
    logging.getLogger().addHandler(logging.NullHandler())  # the store's and urllib3's warnings are expected here

    rng = random.Random(f"{seed}/hub-data")
    files = {"data/a.tar": rng.randbytes(3000), "data/b.tar": rng.randbytes(5000), "data/notes.txt": rng.randbytes(700)}
    tally: dict[str, int] = {}
    with hubserver.HubServer(token=TOKEN, page_size=2) as server:
        sha = server.create("org/data", {**files, "README.md": b"# fuzz\n"}, private=True)
        server.tag("org/data", "v1", sha)
        ctx = Context(server, sha, [hashlib.sha256(files[n]).hexdigest() for n in ("data/a.tar", "data/b.tar")])
        allowed = {f"hub 127.0.0.1:{ctx.ports['hub']}"}
        options = HFOptions(token=TOKEN, endpoint=server.url, max_attempts=2, connect_timeout=2, read_timeout=5,
                            max_unranged_bytes=64 << 10, connections=2)
        for n in range(first, first + count):
            rng = random.Random(f"{seed}/hub/{n}")
            op = rng.choice(OPERATIONS)
            print(f"CASE hub {n} {op}", flush=True)
            server.clear_answers()
            server.log.clear()
            script = plan(rng, ctx)
            for role in ("hub", "cdn", "other"):
                server.answer_next(None, script, server=role)
            store = HubStore(options)
            try:
                outcome = operate(store, op, rng, ctx, files)
            except StoreError as exc:
                outcome = type(exc).__name__
            except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
                raise AssertionError(f"seed {seed}, hub mutant {n} ({op}): {type(exc).__name__}: {exc}") from exc
            leaked = server.token_origins() - allowed
            assert not leaked, f"seed {seed}, hub mutant {n} ({op}): the token went to {leaked}"
            tally[f"{op} {outcome}"] = tally.get(f"{op} {outcome}", 0) + 1
    print("TALLY", sorted(tally.items()), flush=True)


@pytest.mark.fuzz
@pytest.mark.parametrize("first", batches())
def test_no_hostile_hub_answer_escapes_store_error_hangs_or_moves_the_token(first):
    run_isolated(__file__, first, seconds_per_mutant=0.1)


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
