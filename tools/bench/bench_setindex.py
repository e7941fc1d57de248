"""Benchmark: opening, pickling and loading from a ShardSet of many small local shards.

    python tools/bench/bench_setindex.py [--shards 100000] [--samples 10] [--fields cls,txt] [--dir DIR]

Writes ``--shards`` tar shards of ``--samples`` samples each (a few bytes per field; the tars are
written directly, 512-byte ustar headers, much faster than through ``tarfile``) into ``--dir``
(default a temporary folder, removed afterwards; an existing ``--dir`` that already holds them
is reused, so a rerun skips this), indexes each (``<shard>.hidx``, as ``hydrax shards index``
does) and writes a wids manifest of them. Then, for the shards named by a glob (a set index) and
by the manifest (per-shard indexes loaded as shards are read), each in fresh processes:

- first open: a new, empty ``cache_dir`` (a set index is built from the ``.hidx`` files and
  written); second open: the same ``cache_dir`` (the set index is reused after a ``stat`` per
  shard);
- the ShardSet's pickle (cloudpickle): size and time to pickle and to unpickle; and, as sent to
  workers started from the fork server (:func:`hydrax.procs.pickling.dumps` with ``shared``), the size
  of what stays in the pickle and of the buffers that go out of band into the shared memfd;
- a ``hydrax.Dataloader`` (batch ``--batch``, ``--loaders`` loader processes, a trivial loader
  that reads every field of its sample) started by fork and by the fork server (JAX initialised
  first, as in training): time from creating the Dataloader to its first batch, and the PSS and
  USS (private memory) of a worker while it loads, and of the main process.

It prints one table. At ``--shards 1000 --samples 10000 --fields cls`` it shows the case of big
indexes (10 million samples).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BLOCK = 512


def ustar_header(name: bytes, size: int) -> bytes:
    """A ustar header block for a regular file ``name`` of ``size`` bytes (mode 0444, time 0)."""
    header = bytearray(BLOCK)
    header[0 : len(name)] = name
    header[100:108] = b"0000444\0"
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    header[124:136] = b"%011o\0" % size
    header[136:148] = b"00000000000\0"
    header[148:156] = b" " * 8
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def shard_bytes(first: int, samples: int, fields: list[str]) -> bytes:
    """The tar of samples ``first`` ... ``first + samples - 1``, each field holding its number."""
    parts = []
    for n in range(first, first + samples):
        payload = str(n).encode()
        padding = bytes(-len(payload) % BLOCK)
        for field in fields:
            parts += [ustar_header(b"k%010d.%s" % (n, field.encode()), len(payload)), payload, padding]
    parts.append(bytes(2 * BLOCK))
    return b"".join(parts)


def make_shards(folder: str, shards: int, samples: int, fields: list[str]) -> tuple[list[str], float]:
    """Write and index the shards (unless they are there already); their paths and the seconds spent."""
    from hydrax.shards import ShardEntry, open_index, write_manifest

    paths = [os.path.join(folder, f"s-{n:06d}.tar") for n in range(shards)]
    manifest = os.path.join(folder, "manifest.json")
    if os.path.exists(manifest) and all(os.path.exists(p + ".hidx") for p in (paths[0], paths[-1])):
        return paths, 0.0
    start = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    entries = []
    for n, path in enumerate(paths):
        with open(path, "wb") as f:
            f.write(shard_bytes(n * samples, samples, fields))
        index = open_index(path)  # built and written beside the shard
        entries.append(ShardEntry(path, index.shard_size, None, len(index)))
    write_manifest(entries, manifest)
    return paths, time.perf_counter() - start


def memory() -> dict[str, float]:
    """PSS and USS (private) of this process, in MB."""
    found = {"pss": 0.0, "uss": 0.0}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name == "Pss":
                found["pss"] += int(rest.split()[0]) / 1024
            elif name in ("Private_Clean", "Private_Dirty"):
                found["uss"] += int(rest.split()[0]) / 1024
    return found


def load_sample(sample, arrays, seed):
    """The bench's loader: reads every field, and reports the worker's memory."""
    arrays["n"][...] = sum(len(sample[f]) for f in sample)
    return {"pid": os.getpid(), **memory()}


# -- what each child process measures -----------------------------------------------------------

def child_open(source: str, cache: str) -> dict:
    import cloudpickle

    from hydrax.shards import ShardSet

    start = time.perf_counter()
    dataset = ShardSet(source, cache_dir=cache)
    opened = time.perf_counter() - start
    bytes(dataset[len(dataset) // 2][next(iter(dataset[0]))])
    start = time.perf_counter()
    packed = cloudpickle.dumps(dataset)
    pickled = time.perf_counter() - start
    start = time.perf_counter()
    cloudpickle.loads(packed)
    unpickled = time.perf_counter() - start
    from hydrax.procs.pickling import SHARED_BUFFER_BYTES, dumps

    shared: list = []
    in_band = dumps(dataset, shared)
    return {"open_s": opened, "samples": len(dataset), "pickle_mb": len(packed) / 2**20, "pickle_s": pickled,
            "unpickle_s": unpickled, "main_pss_mb": memory()["pss"], "in_band_mb": len(in_band) / 2**20,
            "shared_mb": sum(b.nbytes for b in shared if b.nbytes >= SHARED_BUFFER_BYTES) / 2**20}


def child_batch(source: str, cache: str, method: str, batch: int, loaders: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hydrax import DataGroup, Dataloader
    from hydrax.shards import ShardSet

    if method == "forkserver":
        jnp.zeros(1).block_until_ready()  # JAX is live: workers start from the fork server
    start = time.perf_counter()
    dataset = ShardSet(source, cache_dir=cache)
    opened = time.perf_counter() - start
    group = DataGroup(batch, dataset, loader_arrays={"n": ((), np.int32, jnp.int32)}, seed=1)
    start = time.perf_counter()
    with Dataloader(load_sample, group, loader_count=loaders, end_at=("batch", 2), timeout_sec=600) as loader:
        for first in loader:
            elapsed = time.perf_counter() - start
            reports = [dict(zip(("pid", "pss", "uss"), r)) for r in
                       zip(*(first.get_additional(k) for k in ("pid", "pss", "uss")))]
            main = memory()
            del first
            break
    workers: dict[int, dict] = {}
    for report in reports:
        workers[report["pid"]] = report  # the last report of each worker
    worst = max(workers.values(), key=lambda r: r["pss"])
    del jax
    return {"open_s": opened, "first_batch_s": elapsed, "worker_pss_mb": worst["pss"], "worker_uss_mb": worst["uss"],
            "main_pss_mb": main["pss"]}


def run_child(args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(source: str, cache: str, batch: int, loaders: int) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    first = run_child(["open", source, cache])
    second = run_child(["open", source, cache])
    result = {"first open (s)": first["open_s"], "second open (s)": second["open_s"],
              "pickle (MB)": second["pickle_mb"], "pickle (s)": second["pickle_s"], "unpickle (s)": second["unpickle_s"],
              "forkserver pickle, in band (MB)": second["in_band_mb"], "  out of band, shared (MB)": second["shared_mb"],
              "main PSS after open (MB)": second["main_pss_mb"]}
    for method in ("fork", "forkserver"):
        found = run_child(["batch", source, cache, method, str(batch), str(loaders)], {"HYDRAX_START_METHOD": method})
        result[f"{method}: first batch (s)"] = found["first_batch_s"]
        result[f"{method}: worker PSS (MB)"] = found["worker_pss_mb"]
        result[f"{method}: worker USS (MB)"] = found["worker_uss_mb"]
        result[f"{method}: main PSS (MB)"] = found["main_pss_mb"]
    result["worker PSS, forkserver / fork"] = result["forkserver: worker PSS (MB)"] / result["fork: worker PSS (MB)"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=10, help="samples per shard")
    parser.add_argument("--fields", default="cls,txt", help="the fields of every sample")
    parser.add_argument("--dir", help="where the shards are (reused when already there); default a temporary folder")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--loaders", type=int, default=2)
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        found = child_open(*rest) if kind == "open" else child_batch(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]))
        print(json.dumps(found))
        return
    folder = args.dir or tempfile.mkdtemp(prefix="hydrax-bench-setindex-")
    try:
        paths, made = make_shards(folder, args.shards, args.samples, args.fields.split(","))
        index_mb = sum(os.path.getsize(p + ".hidx") for p in paths[:1000]) * len(paths) / 1000 / 2**20
        print(f"{len(paths):,} shards x {args.samples:,} samples ({args.fields}) in {folder}"
              f"{f', written and indexed in {made:.0f} s' if made else ''}; their .hidx files about {index_mb:.0f} MB")
        columns = {"glob (set index)": measure(os.path.join(folder, "s-*.tar"), os.path.join(folder, "cache-glob"),
                                               args.batch, args.loaders),
                   "manifest": measure(os.path.join(folder, "manifest.json"), os.path.join(folder, "cache-manifest"),
                                       args.batch, args.loaders)}
        sets = os.path.join(folder, "cache-glob", "sets")
        if os.path.isdir(sets):
            print(f"set index file: {sum(os.path.getsize(os.path.join(sets, n)) for n in os.listdir(sets)) / 2**20:.0f} MB")
        print(f"{'':32}" + "".join(f"{name:>20}" for name in columns))
        for row in next(iter(columns.values())):
            print(f"{row:32}" + "".join(f"{column[row]:>20.3f}" for column in columns.values()))
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
