"""Shards on the Hugging Face Hub: ``hf://datasets/ORG/NAME[@REVISION]/PATH``.

**URLs.** ``hf://datasets/ORG/NAME/PATH`` names a file of a dataset repository;
``hf://ORG/NAME/PATH`` (or ``hf://models/ORG/NAME/PATH``) one of a model repository, as
huggingface_hub's ``HfFileSystem`` writes them. ``@REVISION`` after the name picks a branch, tag
or commit (a ``/`` in a branch name is written ``%2F``: ``@refs%2Fpr%2F3``). PATH may hold globs
and brace ranges; a pattern is matched against one listing of the Hub's tree API.

**Pinning.** :func:`pin_url` turns a URL's revision (``main`` when none is given) into the commit
it points at, with one request to the Hub's revision API, and writes the commit into the URL
(``hf://datasets/ORG/NAME@<sha>/PATH``). Listings, reads and everything that carries shard URLs
(indexes cached by URL, workers that receive a pickled ShardSet, manifests beside the shards)
then name that commit, so a branch that moves during a run changes nothing. A file's version is
its content hash (the LFS sha256, or the git blob id): it is compared with the Hub's ETag whenever
a read asks the Hub, so a read never returns other bytes than were indexed. :func:`check_revisions`
and :func:`record_revisions` keep, beside the cached indexes, the commit a branch pointed at; a
later set-up that finds the branch elsewhere raises :class:`~hydrax.errors.RevisionMovedError`.

**Reads.** ``GET {endpoint}/{datasets/}ORG/NAME/resolve/{sha}/{path}`` with a ``Range`` header.
The Hub answers for a large (LFS or Xet) file with a redirect to a file store on another host.
hydrax follows it itself: the Hub's ETag and commit are on the redirect, the ``Range`` goes on to
the file store. The redirect's target is a signed URL: it serves the file's later reads in this
process (for :data:`~hydrax.shards.hub.store.LOCATION_SECONDS` at most) and is asked for again when the file store refuses
it, which halves the requests and keeps reads clear of the Hub's rate limit on resolves.

**The token** goes only to the endpoint's origin: the scheme, host and port of a request as
urllib3 connects (every URL, a redirect's ``Location`` included, is read once with urllib3's own
parser, and the request goes to exactly the URL that was judged; default ports count as written).
A redirect to any other origin (the file store, another port, ``http`` for ``https``, another
spelling of the host) is followed without it. Redirects of the API (the Hub's answer for a renamed
repository: a ``307`` to the new name, logged once per repository) and the tree API's next pages
are followed within the Hub's host only; at most five redirects a request.

**Bounds.** A ranged request must be answered with ``206`` and the ``Content-Range`` asked for,
and at most the range's length (and one byte more, to see that there is more) is read of its body:
a body longer than the range, announced or sent, is a :class:`~hydrax.errors.StoreError` naming
the URL and the range. A whole-file read takes at most the size the Hub said (``X-Linked-Size``,
else ``Content-Length``), a stream its range. An answer of the API is read up to
:data:`~hydrax.shards.hub.client.MAX_API_BYTES`, JSON nested too deep for Python is a ``StoreError``, and a listing's pages
end within :data:`~hydrax.shards.hub.store.MAX_PAGES` or at the first page named twice. A server or proxy that drops
``Range`` answers ``200`` with the whole object: for an object of at most
``HFOptions.max_unranged_bytes`` the part asked for is cut from it (a warning is logged once per
host); a larger one raises :class:`~hydrax.errors.StoreError` naming the URL and offset before its
body is read. Transient failures (connection errors, truncated bodies, timeouts, 5xx, 429 after
its ``Retry-After``) are retried up to ``max_attempts`` times in all, then raised as
:class:`~hydrax.errors.StoreUnavailableError`; 401 and 403 are
:class:`~hydrax.errors.AccessDeniedError` naming where the token came from, 404
:class:`~hydrax.errors.ObjectNotFoundError`.

**Client.** urllib3, with one pool per process shared by its threads, and a pool of
``HFOptions.connections`` threads for read-ahead's asynchronous reads. Proxies (``HTTPS_PROXY``,
``NO_PROXY``) and CA bundles (``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``; else certifi's) come from
the environment as requests would take them. huggingface_hub, when installed, gives the stored
login (``get_token``). Why these and not obstore, requests or ``HfApi``: see
``docs/object-storage.rst``.

**Modules.** :mod:`~hydrax.shards.hub.url` takes ``hf://`` URLs apart;
:mod:`~hydrax.shards.hub.client` sends requests and reads answers within the bounds above;
:mod:`~hydrax.shards.hub.store` holds :class:`HubStore` (what to ask, and what the answers mean)
with its settings; :mod:`~hydrax.shards.hub.pins` pins URLs and keeps the revision records. Each
imports only those before it; the names here are the ones to use from outside.
"""

from .pins import check_revisions as check_revisions, pin_url as pin_url, pin_urls as pin_urls, record_revisions as record_revisions
from .store import HubStore as HubStore, hub_endpoint as hub_endpoint, hub_store as hub_store, hub_token as hub_token
from .url import HubURL as HubURL, parse_url as parse_url
