"""How to reach each kind of remote store: the option dataclasses, and the environment.

A :class:`StoreOptions` holds one part per kind of store (:class:`S3Options`, :class:`GCSOptions`,
:class:`HTTPOptions`, :class:`HFOptions`); a URL's scheme picks the part that applies. The
environment fills in what the options leave out (an S3 endpoint from ``AWS_ENDPOINT_URL_S3``, see
:func:`with_environment`), and :func:`store_environment` hands the variables the stores' clients
read on to processes that start elsewhere. These are plain settings, apart from any store, so that
the stores, the router and the command line can all take them without importing one another.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible store; None means the standard AWS default for that setting."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    #: Attempts per request before a :class:`~hydrax.errors.StoreUnavailableError`.
    max_attempts: int = 5
    #: Seconds to wait for a connection, and for a whole response, per attempt.
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


@dataclass(frozen=True)
class GCSOptions:
    """How to reach Google Cloud Storage (or an emulator at ``endpoint_url``).

    Credentials come the standard Google way (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata
    server) unless ``service_account_path`` names a key file; ``anonymous`` sends unsigned
    requests (public buckets, emulators).
    """

    endpoint_url: str | None = None
    service_account_path: str | None = None
    anonymous: bool = False
    max_attempts: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


@dataclass(frozen=True)
class HTTPOptions:
    """Plain HTTP(S) servers that honour ``Range`` requests (no listing: name shards explicitly)."""

    max_attempts: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


@dataclass(frozen=True)
class HFOptions:
    """How to reach the Hugging Face Hub for ``hf://`` URLs (see :mod:`hydrax.shards.hub`).

    ``token`` None takes the ``HF_TOKEN`` environment variable, else the login huggingface_hub
    stored (``hf auth login``); ``endpoint`` None takes ``HF_ENDPOINT``, else
    ``https://huggingface.co``, as huggingface_hub does. The token is left out of the repr.
    """

    token: str | None = field(default=None, repr=False)
    endpoint: str | None = None
    max_attempts: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    #: A server or proxy that ignores ``Range`` answers with the whole object: for an object of at
    #: most this many bytes the part asked for is cut out of it; a larger one is a
    #: :class:`~hydrax.errors.StoreError` (downloading gigabytes for a sample is never silent).
    max_unranged_bytes: int = 8 << 20
    #: Requests in flight at once per process (the connection pool's size, and the threads that
    #: serve read-ahead's asynchronous reads).
    connections: int = 64


@dataclass(frozen=True)
class StoreOptions:
    """Settings for every kind of remote store; a URL's scheme picks the part that applies."""

    s3: S3Options = field(default_factory=S3Options)
    gcs: GCSOptions = field(default_factory=GCSOptions)
    http: HTTPOptions = field(default_factory=HTTPOptions)
    hf: HFOptions = field(default_factory=HFOptions)

    def for_scheme(self, scheme: str):
        if scheme == "hf":
            return self.hf
        return self.s3 if scheme == "s3" else self.gcs if scheme == "gs" else self.http


def as_store_options(options: StoreOptions | S3Options | GCSOptions | HTTPOptions | HFOptions | None) -> StoreOptions:
    """``options`` as :class:`StoreOptions` (one scheme's options stand for that scheme)."""
    if options is None:
        return StoreOptions()
    if isinstance(options, HFOptions):
        return StoreOptions(hf=options)
    if isinstance(options, S3Options):
        return StoreOptions(s3=options)
    if isinstance(options, GCSOptions):
        return StoreOptions(gcs=options)
    if isinstance(options, HTTPOptions):
        return StoreOptions(http=options)
    return options


#: The AWS SDKs' variables for an S3 endpoint (MinIO, LocalStack, moto, other clouds), most
#: specific first, as boto3 and the AWS CLI read them.
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


#: Prefixes of the environment variables the stores' clients read (obstore's AWS_* and GOOGLE_*
#: credentials, regions and endpoints; the Hugging Face Hub's HF_*).
ENVIRONMENT_PREFIXES = ("AWS_", "GOOGLE_", "HF_")


def store_environment() -> dict[str, str]:
    """This process's variables that the stores' clients read (:data:`ENVIRONMENT_PREFIXES`):
    what a process reading for it elsewhere needs (``hydrax shards ... --ray`` hands them to
    its Ray tasks, whose workers start from the cluster's environment, not this shell's)."""
    return {name: value for name, value in os.environ.items() if name.startswith(ENVIRONMENT_PREFIXES)}


def endpoint_variable(options: StoreOptions, scheme: str) -> str | None:
    """The variable of :data:`ENDPOINT_VARIABLES` that :func:`with_environment` takes the S3
    endpoint from, or None (another scheme, an endpoint in ``options``, no variable set)."""
    if scheme != "s3" or options.s3.endpoint_url:
        return None
    return next((v for v in ENDPOINT_VARIABLES if os.environ.get(v)), None)


def with_environment(options: StoreOptions, scheme: str) -> StoreOptions:
    """``options`` with an S3 endpoint from :data:`ENDPOINT_VARIABLES` when none is given: the
    store is then built with it explicitly (http allowed for an http endpoint), and keyed by it."""
    variable = endpoint_variable(options, scheme)
    if variable is None:
        return options
    return dataclasses.replace(options, s3=dataclasses.replace(options.s3, endpoint_url=os.environ[variable]))
