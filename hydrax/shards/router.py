"""Which :class:`~hydrax.shards.store.Store` serves a URL: the one place that knows every kind.

:func:`store_for` sends local paths to the local store, ``hf://`` URLs to the Hub's store
(:mod:`hydrax.shards.hub`), and ``s3://``, ``gs://`` and ``http(s)://`` URLs to obstore's
(:class:`~hydrax.shards.objstore.ObjectStore`), one per bucket or server and options, shared in
the process; :func:`origin` names the bucket, server or repository a URL lies in. It sits above
the stores, which know nothing of each other.
"""

from __future__ import annotations

from ..errors import StoreError
from .hub.store import hub_store
from .hub.url import repo_root
from .objstore import ObjectStore, split_url
from .options import StoreOptions, as_store_options, endpoint_variable, with_environment
from .store import REMOTE_SCHEMES, LocalStore, Store, scheme_of

_stores: dict[tuple, Store] = {}
_LOCAL = LocalStore()


def store_for(url: str, options: StoreOptions | None = None) -> Store:
    """The store that holds ``url`` (one per bucket or server and options, shared in the process)."""
    scheme = scheme_of(url)
    if scheme == "file":
        return _LOCAL
    if scheme not in REMOTE_SCHEMES:
        raise StoreError(f"the {scheme}:// scheme is not supported; use local paths, s3://, gs://, http(s):// or hf://",
                         url=url, subject=f"shard URL {url!r}: ")
    options = as_store_options(options)
    if scheme == "hf":
        return hub_store(url, options.hf)
    # Noted before the variable fills the endpoint in, so that errors can say where it came from.
    variable = endpoint_variable(options, scheme)
    options = with_environment(options, scheme)
    _, container, _ = split_url(url, need_key=False)
    key = (scheme, container, options.for_scheme(scheme), variable)
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = ObjectStore(scheme, container, options, variable)
    return store


def origin(url: str) -> str:
    """``scheme://bucket`` (or host) of a remote URL; ``hf://datasets/ORG/NAME`` for the Hub's:
    where ``url`` lies, which two URLs of one bucket, server or repository share."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "hf":
        try:
            return repo_root(url).lower()
        except ValueError:
            return url
    return scheme.lower() + "://" + rest.split("/", 1)[0]
