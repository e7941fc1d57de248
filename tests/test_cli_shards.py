"""``hydrax shards inspect``, ``hydrax stat`` and ``hydrax show`` end to end (``hydrax shards verify``
too, through a local S3 server), on shards written here, checked against numbers computed here."""

import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack

from hydrax.shards import ShardWriter

pytest.importorskip("PIL")

LABELS = ("cat", "dog", "emu")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def hydrax(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hydrax", *args], check=False, capture_output=True, text=True,
                          timeout=slack(120), env=None if env is None else {**os.environ, **env})


def encode(pixels, kind):
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, kind)
    return buffer.getvalue()


def decode(data):
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture
def dataset(tmp_path):
    """Three shards of 8 samples (the last one of 4): PNGs of assorted sizes, a JPEG on every third
    sample, and cls labels (cat twice as often as the others); returns the paths and the samples."""
    rng = np.random.default_rng(7)
    samples = []
    with ShardWriter(str(tmp_path / "train-%02d.tar"), maxcount=8) as writer:
        for i in range(20):
            pixels = rng.integers(0, 256, (5 + i % 4, 6 + i % 3, 3), np.uint8)
            sample = {"__key__": f"k{i:03d}", "png": encode(pixels, "PNG"), "cls": LABELS[i % 4 % 3]}
            if i % 3 == 0:
                sample["jpg"] = encode(pixels, "JPEG")
            writer.write(sample)
            samples.append(sample)
    return writer.paths, samples


def expected_fields(samples):
    fields = {}
    for sample in samples:
        for name, value in sample.items():
            if name != "__key__":
                fields.setdefault(name, []).append(len(value))
    return {name: {"count": len(v), "total": sum(v), "min": min(v), "mean": pytest.approx(np.mean(v)), "max": max(v)}
            for name, v in fields.items()}


def test_inspect_lists_samples_fields_and_sizes(dataset):
    paths, samples = dataset
    result = hydrax("shards", "inspect", "--json", "--limit", "3", paths[1])
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    mine = samples[8:16]
    assert found["url"] == paths[1] and found["samples"] == 8
    assert found["fields"] == expected_fields(mine)
    assert [s["key"] for s in found["first"]] == ["k008", "k009", "k010"]
    assert found["first"][1]["fields"] == {"cls": 3, "jpg": len(mine[1]["jpg"]), "png": len(mine[1]["png"])}
    with open(paths[1], "rb") as f:  # the offsets are where the bytes are
        data = f.read()
    offset = found["first"][0]["offsets"]["png"]
    assert data[offset : offset + len(mine[0]["png"])] == mine[0]["png"]

    text = hydrax("shards", "inspect", paths[2])
    assert text.returncode == 0 and "samples: 4" in text.stdout and "first 4 samples:" in text.stdout
    assert f"k018  cls 3 B, jpg {len(samples[18]['jpg']):,} B, png {len(samples[18]['png']):,} B" in text.stdout

    several = hydrax("shards", "inspect", str(paths[0]).replace("00", "*"))
    assert several.returncode == 2 and "names 3 shards; inspect takes one" in several.stderr
    missing = hydrax("shards", "inspect", paths[0] + ".gone")
    assert missing.returncode == 1 and f"{paths[0]}.gone" in missing.stderr and "does not exist" in missing.stderr


def expected_stats(samples):
    images = {}
    for field in ("png", "jpg"):
        pixels = [decode(s[field]) for s in samples if field in s]
        flat = np.concatenate([p.reshape(-1, 3) for p in pixels]).astype(np.float64) / 255
        images[field] = {"count": len(pixels), "mean": flat.mean(axis=0), "std": flat.std(axis=0),
                         "widths": [p.shape[1] for p in pixels], "heights": [p.shape[0] for p in pixels]}
    return images, Counter(s["cls"] for s in samples)


def check_stats(found, samples):
    images, labels = expected_stats(samples)
    assert found["samples"] == len(samples)
    assert found["fields"] == expected_fields(samples)
    for field, want in images.items():
        got = found["images"][field]
        assert got["count"] == want["count"] and got["failed"] == 0
        assert got["mean"] == pytest.approx(want["mean"], abs=1e-6) and got["std"] == pytest.approx(want["std"], abs=1e-6)
        assert got["width"] == {"min": min(want["widths"]), "median": np.median(want["widths"]), "max": max(want["widths"])}
        sizes = Counter(f"{w}x{h}" for w, h in zip(want["widths"], want["heights"]))
        ranked = sorted(sizes.items(), key=lambda item: (-item[1], *map(int, item[0].split("x"))))
        assert got["sizes"] == dict(ranked[:10])  # the commonest, ties by width then height
    assert found["labels"] == {"fields": {"cls": len(samples)}, "counts": dict(sorted(labels.items()))}


@pytest.mark.slow
def test_stat_counts_sizes_pixels_and_labels(dataset, tmp_path):
    paths, samples = dataset
    result = hydrax("stat", "--json", str(tmp_path / "train-{00..02}.tar"))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert (found["shards"], found["total_samples"]) == (3, 20)
    check_stats(found, samples)
    assert found["images"]["png"]["sizes"]["6x5"] == sum(1 for i in range(20) if (i % 4, i % 3) == (0, 0))

    limited = json.loads(hydrax("stat", "--json", "--limit", "4", "--no-pixels", str(tmp_path / "train-*.tar")).stdout)
    assert limited["samples"] == 4 and limited["total_samples"] == 20  # samples 0, 6, 13 and 19
    assert limited["labels"]["counts"] == dict(sorted(Counter(samples[i]["cls"] for i in (0, 6, 13, 19)).items()))
    assert "mean" not in limited["images"]["png"] and limited["images"]["png"]["count"] == 4

    text = hydrax("stat", "-q", "--label-field", "cls", paths[0])
    assert text.returncode == 0, text.stderr
    assert "shards: 1  samples: 8" in text.stdout and "labels (cls): 3 distinct over 8 samples" in text.stdout
    assert "cat          4  50.0%" in text.stdout and "images (png): 8 read" in text.stdout and "  mean  " in text.stdout

    with ShardWriter(str(tmp_path / "odd-%02d.tar"), maxcount=10) as writer:
        writer.write({"__key__": "ok", "png": samples[0]["png"], "cls": "1"})
        writer.write({"__key__": "broken", "png": b"\x89PNG not really", "cls": "2"})
    bad = hydrax("stat", "-q", writer.paths[0])
    assert bad.returncode == 1 and f"hydrax stat: {writer.paths[0]}: sample 'broken' field 'png': not an image" in bad.stderr
    assert "images (png): 1 read, 1 unreadable" in bad.stdout
    missing = hydrax("stat", str(tmp_path / "nothing-*.tar"))
    assert missing.returncode == 1 and "nothing-*.tar" in missing.stderr and "matches no file" in missing.stderr


@pytest.mark.slow
def test_show_writes_a_grid_and_keeps_existing_files(dataset, tmp_path):
    from PIL import Image

    from hydrax.commands.show import grid_size

    paths, _ = dataset
    out = tmp_path / "grid.png"
    result = hydrax("show", "--count", "7", "--tile", "40", str(tmp_path / "train-*.tar"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert grid_size(7, 3, 40) == (3 * 44 + 4, 3 * (40 + 28) + 4)
    with Image.open(out) as grid:
        assert grid.format == "PNG" and grid.size == grid_size(7, 3, 40)
        first = np.asarray(grid.convert("RGB"))[4:44, 4:44]
    assert first.std() > 20  # the first tile holds the (noisy) first image
    assert "7 samples in a 3x3 grid" in result.stdout
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]

    before = out.read_bytes()
    again = hydrax("show", "--count", "4", str(paths[0]), "--out", str(out))
    assert again.returncode == 1 and f"{out} exists; pass --force" in again.stderr and out.read_bytes() == before
    shuffled = hydrax("show", "-n", "30", "--shuffle", "--seed", "2", "--columns", "5", "--tile", "32", "--force",
                      str(tmp_path / "train-*.tar"), "-o", str(out))
    assert shuffled.returncode == 0, shuffled.stderr
    with Image.open(out) as grid:
        assert grid.size == grid_size(20, 5, 32)  # only 20 samples exist
    repeat = tmp_path / "again.png"
    hydrax("show", "-n", "30", "--shuffle", "--seed", "2", "--columns", "5", "--tile", "32", str(tmp_path / "train-*.tar"),
           "-o", str(repeat))
    assert repeat.read_bytes() == out.read_bytes()

    with ShardWriter(str(tmp_path / "text-%02d.tar"), maxcount=10) as writer:
        writer.write({"__key__": "words", "txt": "no picture here"})
    missing_image = hydrax("show", writer.paths[0], "--out", str(tmp_path / "text.png"))
    assert missing_image.returncode == 1 and f"{writer.paths[0]}: sample 'words': has no image field" in missing_image.stderr
    assert (tmp_path / "text.png").exists()  # the grid is written, the sample crossed out


@pytest.mark.parametrize("command", [("shards", "inspect"), ("stat",), ("show",)])
def test_help_explains_with_an_example(command):
    result = hydrax(*command, "--help")
    assert result.returncode == 0 and "examples:" in result.stdout and f"hydrax {' '.join(command)} " in result.stdout


@pytest.fixture
def server(s3_store):
    return s3_store


@pytest.fixture
def bucket(server, dataset, tmp_path):
    """The module's shards uploaded under ``s3://data/shards/``: (endpoint, boto3 client, local
    paths, samples, the environment a command reads it with)."""
    endpoint, client = server
    paths, samples = dataset
    for path in paths:
        client.upload_file(path, "data", f"shards/{os.path.basename(path)}")
    return endpoint, client, paths, samples, {**CREDENTIALS, "HYDRAX_CACHE": str(tmp_path / "cache")}


def test_bench_through_s3_says_the_readahead_budget_it_chose(bucket):
    endpoint, _, _, _, env = bucket
    result = hydrax("bench", "--endpoint-url", endpoint, "s3://data/shards/train-*.tar", "--decode", "bytes",
                    "--seconds", f"{slack(2):.1f}", "--batch-size", "4", "-q", env=env)
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[-1]
    # a few kB of shards: the budget holds them all, and what was held stayed within it
    assert re.fullmatch(r"read-ahead budget [\d.]+ GB \(the data's [\d.]+ GB and room to spare; holds all of the remote data\); "
                        r"read [\d.,]+ MB in [\d,]+ requests, held at most [\d.,]+ MB", line), line


def test_verify_and_stat_through_s3(bucket, tmp_path):
    endpoint, client, paths, samples, env = bucket
    client.put_object(Bucket="data", Key="broken/cut.tar", Body=Path(paths[0]).read_bytes()[:1500])

    result = hydrax("shards", "verify", "--decode", "--endpoint-url", endpoint, "s3://data/shards/train-*.tar", env=env)
    assert result.returncode == 0, result.stderr
    assert "3 shards, 20 samples, 27 images decoded: 3 ok" in result.stdout
    assert re.search(r"^s3://data/shards/train-00.tar +8 +11 +none +ok$", result.stdout, re.MULTILINE)  # no index object beside it
    broken = hydrax("shards", "verify", "-q", "--endpoint-url", endpoint, "s3://data/broken/cut.tar",
                    "s3://data/shards/none.tar", env=env)
    assert broken.returncode == 1
    assert "hydrax shards verify: s3://data/broken/cut.tar: at byte offset" in broken.stderr and "truncated" in broken.stderr
    assert "s3://data/shards/none.tar: does not exist" in broken.stderr

    stat = hydrax("stat", "--json", "-q", "--endpoint-url", endpoint, "--region", "us-east-1",
                  "s3://data/shards/train-{00..02}.tar", env=env)
    assert stat.returncode == 0, stat.stderr
    check_stats(json.loads(stat.stdout), samples)
    assert not os.path.exists(tmp_path / "cache")  # stat writes no index anywhere


@pytest.mark.slow
def test_an_unreachable_endpoint_is_named_and_fails_fast(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**CREDENTIALS, "HYDRAX_CACHE": str(tmp_path)}
    for command in (("shards", "verify"), ("stat",), ("shards", "inspect"), ("show", "--out", str(tmp_path / "g.png"))):
        started = time.monotonic()
        result = hydrax(*command, "--endpoint-url", f"http://127.0.0.1:{port}", "s3://data/train-00.tar", env=env)
        assert result.returncode == 1, (command, result.stderr)
        assert "s3://data/train-00.tar" in result.stderr and "the request failed after retries" in result.stderr, result.stderr
        assert time.monotonic() - started < slack(30)  # a few retries of a refused connection: a few seconds


@pytest.mark.slow
def test_index_with_workers_writes_what_one_process_writes_and_names_a_damaged_shard(tmp_path):
    folders = {}
    for workers in (1, 2):
        folder = folders[workers] = tmp_path / f"w{workers}"
        folder.mkdir()
        with ShardWriter(str(folder / "t-%02d.tar"), maxcount=4, index=False, mtime=0) as writer:
            for i in range(22):
                writer.write({"__key__": f"k{i:03d}", "txt": f"{i}" * (i + 1), "cls": str(i % 3)})
        (folder / "t-02.tar").write_bytes(Path(writer.paths[2]).read_bytes()[:1000])  # cut short
        for path in writer.paths:
            os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # the same modification times in both folders
        result = hydrax("shards", "index", "--workers", str(workers), str(folder / "t-*.tar"))
        assert result.returncode == 1, result.stderr
        assert "indexed 5 of 6 shards (18 samples newly indexed)" in result.stdout
        assert f"hydrax shards index: {folder / 't-02.tar'}: at byte offset 1024: " in result.stderr
        assert "truncated" in result.stderr and "Traceback" not in result.stderr
    written = {workers: sorted(p.name for p in folder.glob("*.hidx")) for workers, folder in folders.items()}
    assert written[1] == written[2] == [f"t-{n:02d}.tar.hidx" for n in (0, 1, 3, 4, 5)]
    for name in written[1]:
        assert (folders[1] / name).read_bytes() == (folders[2] / name).read_bytes()
    again = hydrax("shards", "index", "-j", "2", "-q", str(folders[2] / "t-0[013].tar"))
    assert again.returncode == 0 and again.stdout == "" and again.stderr == ""


def test_index_writes_index_objects_and_a_manifest_into_the_bucket(bucket, tmp_path):
    from hydrax.shards import S3Options, ShardIndex, ShardSet

    endpoint, client, paths, samples, env = bucket
    result = hydrax("shards", "index", "--endpoint-url", endpoint, "s3://data/shards/train-*.tar",
                    "--manifest", "s3://data/shards/train.json", env=env)
    assert result.returncode == 0, result.stderr
    assert re.search(r"indexed 3 shards \(20 samples\) in [\d.]+ s: an index object beside each; manifest s3://data/shards/train.json",
                     result.stdout), result.stdout
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="data")["Contents"])
    assert keys == sorted([f"shards/{os.path.basename(p)}{s}" for p in paths for s in ("", ".hidx")]
                          + ["shards/train.json", "shards/hydrax-index.json"])
    head = client.head_object(Bucket="data", Key="shards/train-00.tar")
    index = ShardIndex.from_bytes(client.get_object(Bucket="data", Key="shards/train-00.tar.hidx")["Body"].read())
    assert (index.etag, index.shard_size) == (head["ETag"], head["ContentLength"])
    manifest = json.loads(client.get_object(Bucket="data", Key="shards/train.json")["Body"].read())
    assert manifest["__kind__"] == "wids-shard-index-v1"
    assert [(e["url"], e["nsamples"], e["filesize"]) for e in manifest["shardlist"]] == [
        (os.path.basename(p), n, os.path.getsize(p)) for p, n in zip(paths, [8, 8, 4])]
    options = S3Options(endpoint_url=endpoint, access_key_id="testing", secret_access_key="testing", region="us-east-1")
    from_manifest = ShardSet("s3://data/shards/train.json", s3=options, cache_dir=str(tmp_path / "c2"))
    local = ShardSet(paths)
    assert [(s.key, bytes(s["png"])) for s in from_manifest] == [(s.key, bytes(s["png"])) for s in local]
    again = hydrax("shards", "index", "-q", "--endpoint-url", endpoint, "s3://data/shards/train-*.tar", env=env)
    assert again.returncode == 0 and again.stdout == ""


def test_index_records_image_sizes_locally_and_in_the_bucket_and_says_how_many(bucket, tmp_path):
    from hydrax.shards import S3Options, ShardSet

    endpoint, client, paths, samples, env = bucket
    expected = [decode(s["jpg"]).shape[1::-1] if "jpg" in s else (0, 0) for s in samples]
    summary = "image sizes of field 'jpg': 7 samples with a size, 13 recorded as 0x0 (13 without the field, 0 whose header could not be read)"
    result = hydrax("shards", "index", "--sizes", "jpg", *paths)
    assert result.returncode == 0, result.stderr
    assert "indexed 3 of 3 shards (0 samples newly indexed; image sizes added to 3 current indexes)" in result.stdout
    assert summary in result.stdout
    widths, heights = ShardSet(paths, cache_dir=str(tmp_path / "local")).image_sizes()
    assert list(zip(widths.tolist(), heights.tolist())) == expected
    again = hydrax("shards", "index", "--sizes", "jpg", *paths)
    assert "(0 samples newly indexed)" in again.stdout and summary in again.stdout  # current, with them: kept
    png = hydrax("shards", "index", "--sizes", "PNG", *paths)  # another field's: given those instead
    assert "image sizes added to 3" in png.stdout and "'png': 20 samples with a size, 0 recorded as 0x0" in png.stdout
    assert hydrax("shards", "index", "--sizes", ".png", *paths).returncode == 2
    remote = hydrax("shards", "index", "--sizes", "jpg", "--endpoint-url", endpoint, "s3://data/shards/train-*.tar", env=env)
    assert remote.returncode == 0 and summary in remote.stdout, remote.stderr
    options = S3Options(endpoint_url=endpoint, access_key_id="testing", secret_access_key="testing", region="us-east-1")
    widths, heights = ShardSet("s3://data/shards/train-*.tar", s3=options, cache_dir=str(tmp_path / "c3")).image_sizes("jpg")
    assert list(zip(widths.tolist(), heights.tolist())) == expected


def test_commands_read_gcs_through_the_endpoint_option(gcs_store, dataset, tmp_path):
    endpoint, upload = gcs_store
    paths, samples = dataset
    for path in paths:
        upload(f"shards/{os.path.basename(path)}", Path(path).read_bytes())
    env = {"HYDRAX_CACHE": str(tmp_path / "cache")}
    result = hydrax("shards", "verify", "--endpoint-url", endpoint, "gs://data/shards/train-*.tar", env=env)
    assert result.returncode == 0, result.stderr
    assert "3 shards, 20 samples" in result.stdout and "3 ok" in result.stdout
    stat = hydrax("stat", "--json", "-q", "--endpoint-url", endpoint, "gs://data/shards/train-{00..02}.tar", env=env)
    assert stat.returncode == 0, stat.stderr
    check_stats(json.loads(stat.stdout), samples)
