"""The other loaders people pick for object storage, run on the samples bench_remote.py streams.

Run with the peers venv's python (see README.md beside this file), not hydrax's: LitData and
MosaicML Streaming pull in torch, boto3 and obstore versions of their own.

    run_peer.py convert --tars DIR_OR_GLOB --format litdata|mds --out DIR [--chunk-bytes N]
    run_peer.py upload  --src DIR --remote s3://bucket/prefix --endpoint http://127.0.0.1:PORT
    run_peer.py load    --format litdata|mds --remote s3://bucket/prefix --endpoint http://127.0.0.1:PORT
                        --expect N [--workers 2] [--shuffle] [--batch 32] [--cache DIR] [--no-workaround]

``convert`` reads WebDataset tars with plain ``tarfile`` (members grouped by key: the name up to the
first dot of its last component; each sample has ``<key>.cls``, an ASCII int, and ``<key>.bin``)
and writes them as LitData's optimized chunks (``litdata.optimize``) or MDS (``MDSWriter``), of
64 MiB unless ``--chunk-bytes`` says otherwise, fields ``key`` str, ``cls`` int, ``bin`` bytes; it
prints how many samples it wrote and fails if that is not how many it read.

``load`` runs one epoch, from an empty cache folder, through the loader's own torch DataLoader
with ``--workers`` processes: LitData's ``StreamingDataset`` + ``StreamingDataLoader``, or
MosaicML's ``StreamingDataset(remote=..., local=..., shuffle=..., batch_size=...)`` + torch's
``DataLoader``. In the workers a collate function copies each sample's ``bin`` into the batch's
preallocated uint8 array (what bench_remote's ``copy_sample`` does in hydrax's loader processes);
the main process checks every key arrives exactly once and the count equals ``--expect``. Time
runs from constructing the dataset to the last batch. Prints one JSON line::

    {"loader": "litdata", "shuffle": false, "samples": 16384, "seconds": ..., "samples_per_s": ...,
     "first_batch_s": ..., "load_average": ...}

Credentials are moto's (``testing``/``testing``, ``us-east-1``).

Workarounds (each one is needed to run against an ``http://`` endpoint at all, or reliably;
``--no-workaround`` leaves it out, to show the failure; README.md has the evidence):

* **LitData**: its chunk downloads go through an obstore ``S3Store`` that
  ``litdata.streaming.downloader._build_obstore_s3_store`` builds from the boto3 client's
  endpoint, passing ``client_options=_OBSTORE_CLIENT_OPTIONS`` (timeouts, pool sizes) and no
  ``allow_http``; so with an ``http://`` endpoint every chunk GET is refused ("HTTP error: builder
  error", reqwest's BadScheme) and the epoch dies. obstore would take ``AWS_ALLOW_HTTP=true`` from
  the environment, but explicit client options replace the environment's, so that does nothing.
  The workaround adds ``allow_http`` to that module-level dict in this process before the
  DataLoader forks (one line; the download path, obstore, stays LitData's default). The boto3
  side (``index.json``) takes the endpoint from ``storage_options={"endpoint_url": ...}``.
* **MosaicML Streaming**: its ``S3Downloader`` builds one boto3 client lazily and keeps it; the
  dataset downloads ``index.json`` with it in the main process, and torch's DataLoader forks the
  workers, which then share that client (its urllib3 pool, and the keep-alive socket to the
  proxy in it): about 4 runs in 10 stall for Streaming's 60 s download timeout. The workaround
  is a ``worker_init_fn`` that calls ``clean_up()`` on each stream's downloader, so each forked
  worker builds a client of its own. ``--mds-spawn`` instead spawns the workers
  (``multiprocessing_context="spawn"``: the pickled dataset drops the client), public API only
  but several seconds slower to start (each worker imports torch, Streaming and transformers).
  The endpoint comes from ``S3_ENDPOINT_URL``, the only way Streaming takes one.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tarfile
import time

ACCESS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_REGION": "us-east-1"}
PEER_PACKAGES = {"litdata": ("litdata", "litdata==0.2.76"), "mds": ("streaming", "mosaicml-streaming==0.13.0")}


def _stand_in_for_broken_torchvision() -> None:
    """MosaicML Streaming imports torchvision at ``import streaming`` (for its CIFAR/ImageNet
    dataset classes, unused here). PyPI's torchvision is a CUDA build whose extension does not load
    beside the CPU torch wheel ("operator torchvision::nms does not exist"), and there is no CPU
    torchvision to install from PyPI. Where ``import torchvision`` fails, empty stand-in modules take
    its place so ``import streaming`` works; nothing here calls into them. Runs at import, so
    spawned DataLoader workers (which re-import this file) get it too."""
    import importlib.machinery
    import types

    try:
        import torchvision  # noqa: F401
        return
    except Exception:  # RuntimeError from the extension, or ImportError
        pass
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]

    def unavailable(*args, **kwargs):
        raise RuntimeError("torchvision is a stand-in here (see run_peer.py)")

    class VisionDataset:  # base class of streaming.vision's datasets
        def __init__(self, *args, **kwargs):
            unavailable()

    modules = {name: types.ModuleType(name) for name in
               ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")}
    for name, module in modules.items():  # importlib.util.find_spec (transformers calls it) needs a spec
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=name.count(".") < 2)
    modules["torchvision"].datasets = modules["torchvision.datasets"]
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    modules["torchvision.transforms"].functional = modules["torchvision.transforms.functional"]
    modules["torchvision.datasets"].VisionDataset = VisionDataset
    modules["torchvision.datasets"].CIFAR10 = VisionDataset
    modules["torchvision.transforms.functional"].to_tensor = unavailable
    sys.modules.update(modules)


if os.environ.get("RUN_PEER_NO_TORCHVISION_SHIM") != "1":
    try:
        _stand_in_for_broken_torchvision()
    except ImportError:  # no torch at all: need() says how to install it
        pass


def need(module: str, requirement: str):
    """Import ``module`` or exit with how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        sys.exit(f"run_peer.py: cannot import {module!r} ({exc}). Run this script with the peers venv's python, "
                 f"made with: python3 -m venv /tmp/peers-venv && /tmp/peers-venv/bin/pip install -r "
                 f"tools/bench/peers/requirements.txt (it pins {requirement}).")


# -- convert --------------------------------------------------------------------------------------

def tar_paths(spec: str) -> list[str]:
    if os.path.isdir(spec):
        paths = sorted(glob.glob(os.path.join(spec, "*.tar")))
    else:
        paths = sorted(glob.glob(spec))
    if not paths:
        sys.exit(f"run_peer.py: no .tar files at {spec!r}")
    return paths


def _key_and_field(name: str) -> tuple[str, str]:
    folder, _, base = name.rpartition("/")
    stem, dot, field = base.partition(".")
    if not dot:
        raise ValueError(f"tar member {name!r} has no extension")
    return (f"{folder}/{stem}" if folder else stem), field


def read_samples(path: str):
    """The samples of one WebDataset tar, in order: {"key": str, "cls": int, "bin": bytes}."""

    def finish(key, fields):
        if "cls" not in fields or "bin" not in fields:
            raise ValueError(f"{path}: sample {key!r} lacks .cls or .bin (has {sorted(fields)})")
        return {"key": key, "cls": int(fields["cls"].decode("ascii").strip()), "bin": fields["bin"]}

    key, fields = None, {}
    with tarfile.open(path, "r|*") as tar:  # streamed: members in the order they were written
        for member in tar:
            if not member.isfile():
                continue
            name_key, field = _key_and_field(member.name)
            if name_key != key:
                if key is not None:
                    yield finish(key, fields)
                key, fields = name_key, {}
            fields[field] = tar.extractfile(member).read()
    if key is not None:
        yield finish(key, fields)


def _litdata_samples(path: str):  # a generator fn: litdata.optimize writes every item it yields
    yield from read_samples(path)


def convert(args) -> None:
    paths = tar_paths(args.tars)
    read = sum(1 for path in paths for _ in read_samples(path))
    if os.path.exists(args.out) and os.listdir(args.out):
        sys.exit(f"run_peer.py: {args.out!r} is not empty")
    started = time.perf_counter()
    if args.format == "litdata":
        litdata = need("litdata", PEER_PACKAGES["litdata"][1])
        # one input per tar, spread over the workers; each yields its samples
        litdata.optimize(fn=_litdata_samples, inputs=paths, output_dir=os.path.abspath(args.out), chunk_bytes=args.chunk_bytes,
                         num_workers=min(len(paths), args.workers), mode="overwrite", verbose=False)
        with open(os.path.join(args.out, "index.json")) as f:
            index = json.load(f)
        written = sum(chunk["chunk_size"] for chunk in index["chunks"])
    else:
        streaming = need("streaming", PEER_PACKAGES["mds"][1])
        written = 0
        with streaming.MDSWriter(out=args.out, columns={"key": "str", "cls": "int", "bin": "bytes"},
                                 size_limit=args.chunk_bytes) as writer:
            for path in paths:
                for sample in read_samples(path):
                    writer.write(sample)
                    written += 1
        with open(os.path.join(args.out, "index.json")) as f:
            assert sum(shard["samples"] for shard in json.load(f)["shards"]) == written
    if written != read:
        sys.exit(f"run_peer.py: read {read} samples from {len(paths)} tars but wrote {written}")
    print(f"converted {written} samples from {len(paths)} tars to {args.format} in {args.out} "
          f"({time.perf_counter() - started:.1f} s)")


# -- upload ---------------------------------------------------------------------------------------

def split_s3(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        sys.exit(f"run_peer.py: {url!r} is not an s3:// URL")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    return bucket, prefix.strip("/")


def s3_client(endpoint: str):
    boto3 = need("boto3", "boto3")
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def upload(args) -> None:
    from concurrent.futures import ThreadPoolExecutor

    bucket, prefix = split_s3(args.remote)
    client = s3_client(args.endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    except Exception as exc:  # already there under another owner, or no permission: the uploads will tell
        if "BucketAlreadyExists" not in str(exc):
            raise
    files = [os.path.join(root, name) for root, _, names in os.walk(args.src) for name in names]

    def one(path):
        key = "/".join(filter(None, [prefix, os.path.relpath(path, args.src).replace(os.sep, "/")]))
        client.upload_file(path, bucket, key)
        return os.path.getsize(path)

    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(one, files))
    print(f"uploaded {len(files)} files ({total / 1e6:.1f} MB) to {args.remote}")


# -- load -----------------------------------------------------------------------------------------

def collate_into_array(samples):
    """In the worker: each sample's bytes copied into the batch's preallocated uint8 array (a torch
    tensor, so the batch goes back through shared memory as in any torch pipeline)."""
    import numpy as np
    import torch

    width = max(len(s["bin"]) for s in samples)
    batch = torch.zeros((len(samples), width), dtype=torch.uint8)
    array = batch.numpy()
    for row, sample in zip(array, samples):
        data = sample["bin"]
        row[: len(data)] = np.frombuffer(data, np.uint8)
    return {"key": [str(s["key"]) for s in samples], "cls": torch.tensor([int(s["cls"]) for s in samples]), "bin": batch}


def _litdata_loader(args):
    litdata = need("litdata", PEER_PACKAGES["litdata"][1])
    if not args.no_workaround and args.endpoint.lower().startswith("http://"):
        # obstore (LitData's chunk downloads) refuses http:// unless allow_http is set, and the
        # client options LitData passes every S3Store it builds replace any from the environment
        # (AWS_ALLOW_HTTP is ignored): add allow_http to those options. Module state, set before
        # the DataLoader forks its workers, which inherit it. See the docstring.
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    storage_options = {"endpoint_url": args.endpoint, "aws_access_key_id": "testing",
                       "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    dataset = litdata.StreamingDataset(args.remote, cache_dir=args.cache, shuffle=args.shuffle,
                                       storage_options=storage_options)
    loader = litdata.StreamingDataLoader(dataset, batch_size=args.batch, num_workers=args.workers,
                                         collate_fn=collate_into_array)
    return dataset, loader


def _own_s3_client(worker_id: int) -> None:
    """In each forked DataLoader worker: drop the boto3 client the dataset built in the main
    process (to fetch index.json), so this worker's first download builds its own, with its own
    connections. Streaming's ``S3Downloader.clean_up()`` does just that."""
    from torch.utils.data import get_worker_info

    for stream in get_worker_info().dataset.streams:
        stream._downloader.clean_up()


def _mds_loader(args):
    streaming = need("streaming", PEER_PACKAGES["mds"][1])
    from torch.utils.data import DataLoader

    os.environ["S3_ENDPOINT_URL"] = args.endpoint  # the only way Streaming takes an endpoint
    # Streaming keeps its shared-memory state by the local folder's name: a fresh one per run.
    streaming.base.util.clean_stale_shared_memory()
    dataset = streaming.StreamingDataset(remote=args.remote, local=args.cache, shuffle=args.shuffle,
                                         batch_size=args.batch)
    if args.no_workaround:
        extra = {}
    elif args.mds_spawn:
        extra = {"multiprocessing_context": "spawn"}
    else:
        extra = {"worker_init_fn": _own_s3_client}
    loader = DataLoader(dataset, batch_size=args.batch, num_workers=args.workers, collate_fn=collate_into_array,
                        **extra)
    return dataset, loader


def load(args) -> None:
    need("torch", "torch==2.13.0")
    os.environ.update({k: v for k, v in ACCESS.items() if k not in os.environ or args.force_keys})
    os.makedirs(args.cache, exist_ok=True)
    if os.listdir(args.cache):
        sys.exit(f"run_peer.py: the cache folder {args.cache!r} is not empty (one epoch from an empty cache)")
    seen: set[str] = set()
    duplicates = 0
    first = None
    started = time.perf_counter()  # dataset construction, index download and the workers' start included
    _, loader = (_litdata_loader if args.format == "litdata" else _mds_loader)(args)
    for batch in loader:
        if first is None:
            first = time.perf_counter() - started
        for key in batch["key"]:
            duplicates += key in seen
            seen.add(key)
    elapsed = time.perf_counter() - started
    samples = len(seen) + duplicates
    record = {"loader": "litdata" if args.format == "litdata" else "mosaicml-streaming", "shuffle": args.shuffle,
              "samples": samples, "seconds": round(elapsed, 3), "samples_per_s": round(samples / elapsed, 1),
              "first_batch_s": round(first, 3) if first is not None else None,
              "load_average": round(os.getloadavg()[0], 2)}
    if args.no_workaround:
        record["workaround"] = False
    print(json.dumps(record), flush=True)
    problems = []
    if duplicates:
        problems.append(f"{duplicates} samples arrived more than once")
    if args.expect is not None and len(seen) != args.expect:
        problems.append(f"{len(seen)} distinct samples, expected {args.expect}")
    if problems:
        sys.exit("run_peer.py: " + "; ".join(problems))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("convert", help="WebDataset tars to LitData or MDS")
    c.add_argument("--tars", required=True, help="a folder of .tar files, or a glob")
    c.add_argument("--format", choices=("litdata", "mds"), required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--workers", type=int, default=2, help="litdata.optimize's processes")
    c.add_argument("--chunk-bytes", type=int, default=64 << 20,
                   help="the chunk (LitData) or shard (MDS) size limit; 64 MiB, both libraries' usual size")
    u = commands.add_parser("upload", help="a converted folder to s3://bucket/prefix (creates the bucket)")
    u.add_argument("--src", required=True)
    u.add_argument("--remote", required=True)
    u.add_argument("--endpoint", required=True, help="the S3 server itself, not the delaying proxy")
    ld = commands.add_parser("load", help="one timed epoch; prints one JSON line")
    ld.add_argument("--format", choices=("litdata", "mds"), required=True)
    ld.add_argument("--remote", required=True, help="s3://bucket/prefix the converted folder was uploaded to")
    ld.add_argument("--endpoint", required=True, help="http://host:port (the delaying proxy)")
    ld.add_argument("--workers", type=int, default=2)
    ld.add_argument("--shuffle", action="store_true")
    ld.add_argument("--batch", type=int, default=32)
    ld.add_argument("--cache", required=True, help="an empty (or new) folder for the loader's local copies")
    ld.add_argument("--expect", type=int, help="the number of samples in the dataset; fails unless each came once")
    ld.add_argument("--no-workaround", action="store_true", help="leave out the workaround, to see the failure")
    ld.add_argument("--mds-spawn", action="store_true",
                    help="MDS: spawn the workers instead of giving each forked one its own S3 client (slower start)")
    ld.add_argument("--force-keys", action="store_true", help="use moto's testing keys even if AWS_* are set")
    args = parser.parse_args()
    {"convert": convert, "upload": upload, "load": load}[args.command](args)


if __name__ == "__main__":
    main()
