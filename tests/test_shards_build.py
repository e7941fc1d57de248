"""``hydrax shards build``: image folders, manifests and file lists into shards, locally and in S3."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack

from hydrax.errors import StoreError
from hydrax.shards import ShardIndex, ShardSet
from hydrax.shards.build import build_shards, shuffled
from hydrax.shards.build.sources import (BuildError, check_key, samples_from_files, samples_from_folder, samples_from_list,
                                        samples_from_manifest)

PIL = pytest.importorskip("PIL.Image")
KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


def hydrax(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hydrax", "shards", "build", *map(str, args)], capture_output=True,
                          text=True, timeout=slack(120), env=env)


def image_bytes(kind, seed, size=(12, 8), profile=None):
    """An RGB image; ``profile`` names an ICC profile of tests/data/icc to embed."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    out = io.BytesIO()
    options = {"quality": 90} if kind == "JPEG" else {}
    if profile is not None:
        options["icc_profile"] = (Path(__file__).parent / "data" / "icc" / f"{profile}.icc").read_bytes()
    PIL.fromarray(pixels).save(out, kind, **options)
    return out.getvalue()


@pytest.fixture
def folder(tmp_path):
    """cat: 3 JPEGs; dog: 2 PNGs, one with dots and capitals in its name, one in a subfolder; emu: 1 JPEG."""
    root = tmp_path / "images"
    files = {
        "cat/c0.jpg": image_bytes("JPEG", 0), "cat/c1.jpg": image_bytes("JPEG", 1), "cat/c2.jpeg": image_bytes("JPEG", 2),
        "dog/d.0.PNG": image_bytes("PNG", 3), "dog/inner/d1.png": image_bytes("PNG", 4), "emu/e0.jpg": image_bytes("JPEG", 5),
    }
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    (root / "cat" / ".DS_Store").write_bytes(b"hidden")  # skipped
    return root, files


EXPECTED = [  # key, field, file, cls, label: sorted by path, class indices in sorted name order
    ("cat/c0", "jpg", "cat/c0.jpg", "0", "cat"), ("cat/c1", "jpg", "cat/c1.jpg", "0", "cat"),
    ("cat/c2", "jpeg", "cat/c2.jpeg", "0", "cat"), ("dog/d_0", "png", "dog/d.0.PNG", "1", "dog"),
    ("dog/inner/d1", "png", "dog/inner/d1.png", "1", "dog"), ("emu/e0", "jpg", "emu/e0.jpg", "2", "emu"),
]


def shards_in(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_an_image_folder_builds_end_to_end_and_reads_back_with_shardset_and_webdataset(folder, tmp_path):
    root, files = folder
    result = hydrax(root, tmp_path / "out" / "train-%03d.tar", "--maxcount", 4, "--workers", 2)
    assert result.returncode == 0, result.stderr
    assert "wrote 2 shards (6 samples" in result.stdout and "images/s" in result.stdout
    assert shards_in(tmp_path / "out") == ["train-000.tar", "train-000.tar.hidx", "train-001.tar", "train-001.tar.hidx"]
    dataset = ShardSet(str(tmp_path / "out" / "train-*.tar"))
    assert dataset.shard_sizes() == [4, 2]
    for sample, (key, field, path, cls, label) in zip(dataset, EXPECTED, strict=True):
        assert sample.key == key and sorted(sample) == sorted([field, "cls", "label"])
        assert bytes(sample[field]) == files[path]  # stored as they are
        assert bytes(sample["cls"]) == cls.encode() and bytes(sample["label"]) == label.encode()
    wds = pytest.importorskip("webdataset")
    read = list(wds.WebDataset(str(tmp_path / "out" / "train-{000..001}.tar"), shardshuffle=False))
    assert [(r["__key__"], r[field], r["cls"], r["label"]) for r, (_, field, *_) in zip(read, EXPECTED)] == \
        [(key, files[path], cls.encode(), label.encode()) for key, _, path, cls, label in EXPECTED]


def test_identical_input_gives_byte_identical_shards_whatever_the_workers(folder, tmp_path):
    root, _ = folder
    for name, workers in (("a", 1), ("b", 2), ("c", 3)):
        report = build_shards(samples_from_folder(root), str(tmp_path / name / "s-%02d.tar"), maxcount=4, workers=workers,
                              check_images=True)
        assert (report.samples, len(report.shards)) == (6, 2) and report.shard_bytes == sum(
            os.path.getsize(p) for p in report.shards)
    for n in range(2):
        first = (tmp_path / "a" / f"s-{n:02d}.tar").read_bytes()
        assert first == (tmp_path / "b" / f"s-{n:02d}.tar").read_bytes() == (tmp_path / "c" / f"s-{n:02d}.tar").read_bytes()


@pytest.mark.slow
def test_shuffle_permutes_with_pcg64_and_the_seed_fixes_it(folder, tmp_path):
    root, _ = folder
    samples = samples_from_folder(root)
    order = np.random.Generator(np.random.PCG64(7)).permutation(6)
    assert [s.key for s in shuffled(samples, 7)] == [EXPECTED[i][0] for i in order]
    result = hydrax(root, tmp_path / "x" / "s-%d.tar", "--shuffle", "--seed", 7, "-q")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert [s.key for s in ShardSet(str(tmp_path / "x" / "s-0.tar"))] == [EXPECTED[i][0] for i in order]
    assert hydrax(root, tmp_path / "y" / "s-%d.tar", "--shuffle", "--seed", 7, "-q").returncode == 0
    assert (tmp_path / "x" / "s-0.tar").read_bytes() == (tmp_path / "y" / "s-0.tar").read_bytes()
    build_shards(samples, str(tmp_path / "z" / "s-%d.tar"), shuffle_seed=8)
    assert [s.key for s in ShardSet(str(tmp_path / "z" / "s-0.tar"))] != [EXPECTED[i][0] for i in order]
    assert hydrax(root, tmp_path / "w" / "s-%d.tar", "--seed", 7).returncode == 2  # a seed without --shuffle


def test_maxcount_and_maxsize_roll_over(tmp_path):
    (tmp_path / "src").mkdir()
    for i in range(7):
        (tmp_path / "src" / f"s{i}.bin").write_bytes(b"x" * 100)
    samples = samples_from_files(sorted((tmp_path / "src").iterdir()))
    assert [s.key for s in samples] == [f"s{i}" for i in range(7)] and samples[0].files == {"bin": str(tmp_path / "src" / "s0.bin")}
    by_count = build_shards(samples, str(tmp_path / "a" / "c-%04d.tar"), maxcount=3)
    assert [len(ShardSet(p)) for p in by_count.shards] == [3, 3, 1]
    assert by_count.shards == [str(tmp_path / "a" / f"c-{n:04d}.tar") for n in range(3)] and by_count.payload_bytes == 700
    by_size = build_shards(samples, str(tmp_path / "b" / "z-%d.tar"), maxsize=250)  # 300 >= 250 starts the next
    assert [len(ShardSet(p)) for p in by_size.shards] == [3, 3, 1]
    result = hydrax(tmp_path / "src" / "s0.bin", tmp_path / "src" / "s1.bin", tmp_path / "c" / "k-%d.tar", "--maxsize", "0.1kB")
    assert result.returncode == 0, result.stderr
    assert shards_in(tmp_path / "c") == ["k-0.tar", "k-0.tar.hidx", "k-1.tar", "k-1.tar.hidx"]


def manifest_files(tmp_path):
    (tmp_path / "m" / "img").mkdir(parents=True)
    files = {f"img/{i}.jpg": image_bytes("JPEG", i) for i in range(3)}
    for name, data in files.items():
        (tmp_path / "m" / name).write_bytes(data)
    return files


def test_csv_and_jsonl_manifests_give_file_fields_and_text_fields(tmp_path):
    files = manifest_files(tmp_path)
    (tmp_path / "m" / "train.csv").write_text("image,Caption,label\nimg/2.jpg,\"a, cat\",7\nimg/0.jpg,dog,3\nimg/1.jpg,émeu,3\n")
    result = hydrax(tmp_path / "m" / "train.csv", tmp_path / "out" / "t-%02d.tar", "--workers", 2)
    assert result.returncode == 0, result.stderr
    assert "samples/s" in result.stdout
    dataset = ShardSet(str(tmp_path / "out" / "t-00.tar"))
    assert [s.key for s in dataset] == ["img/2", "img/0", "img/1"]  # row order
    assert [{f: bytes(s[f]) for f in s} for s in dataset] == [
        {"jpg": files["img/2.jpg"], "caption": b"a, cat", "label": b"7"},
        {"jpg": files["img/0.jpg"], "caption": b"dog", "label": b"3"},
        {"jpg": files["img/1.jpg"], "caption": "émeu".encode(), "label": b"3"},
    ]
    rows = [{"__key__": "first", "image": "img/0.jpg", "label": 3, "meta": {"w": 12}},
            {"__key__": "deep/second", "image": str(tmp_path / "m" / "img" / "1.jpg"), "label": 4, "meta": {"w": 1}}]
    (tmp_path / "m" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = samples_from_manifest(tmp_path / "m" / "train.jsonl", file_columns={"image": "image.jpg"})
    assert [(s.key, s.values) for s in samples] == [("first", {"label": "3", "meta": '{"w":12}'}),
                                                    ("deep/second", {"label": "4", "meta": '{"w":1}'})]
    build_shards(samples, str(tmp_path / "out2" / "j-%d.tar"))
    read = ShardSet(str(tmp_path / "out2" / "j-0.tar"))
    assert bytes(read[1]["image.jpg"]) == files["img/1.jpg"] and bytes(read[0]["meta"]) == b'{"w":12}'


def test_parquet_manifests_need_pyarrow(tmp_path):
    files = manifest_files(tmp_path)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        (tmp_path / "m" / "t.parquet").write_bytes(b"PAR1")
        result = hydrax(tmp_path / "m" / "t.parquet", tmp_path / "out" / "p-%d.tar")
        assert result.returncode == 1 and "t.parquet: reading Parquet manifests needs pyarrow: pip install pyarrow" in result.stderr
        return
    import pandas

    pandas.DataFrame({"path": ["img/0.jpg", "img/1.jpg"], "label": [1, 2], "score": [0.5, 1.0]}).to_parquet(tmp_path / "m" / "t.parquet")
    result = hydrax(tmp_path / "m" / "t.parquet", tmp_path / "out" / "p-%d.tar")
    assert result.returncode == 0, result.stderr
    read = ShardSet(str(tmp_path / "out" / "p-0.tar"))
    assert [(s.key, bytes(s["jpg"]), bytes(s["label"]), bytes(s["score"])) for s in read] == [
        ("img/0", files["img/0.jpg"], b"1", b"0.5"), ("img/1", files["img/1.jpg"], b"2", b"1.0")]


def test_lists_of_files_group_fields_by_the_webdataset_rule(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for name in ("a/1.jpg", "a/1.seg.PNG", "a/2.jpg", "b.txt"):
        (src / name).write_bytes(name.encode())
    (src / "files.txt").write_text("# generated\na/2.jpg\n\na/1.jpg\nb.txt\na/1.seg.PNG\n")
    samples = samples_from_list(src / "files.txt")
    assert [(s.key, sorted(s.files)) for s in samples] == [("a/2", ["jpg"]), ("a/1", ["jpg", "seg.png"]), ("b", ["txt"])]
    result = hydrax(src / "files.txt", tmp_path / "out" / "l-%d.tar")
    assert result.returncode == 0, result.stderr
    read = ShardSet(str(tmp_path / "out" / "l-0.tar"))
    assert [(s.key, {f: bytes(s[f]) for f in s}) for s in read] == [
        ("a/2", {"jpg": b"a/2.jpg"}), ("a/1", {"jpg": b"a/1.jpg", "seg.png": b"a/1.seg.PNG"}), ("b", {"txt": b"b.txt"})]
    result = hydrax(src / "a" / "1.jpg", src / "a" / "1.seg.PNG", src / "a" / "2.jpg", tmp_path / "out2" / "f-%d.tar")
    assert result.returncode == 0, result.stderr
    assert [s.key for s in ShardSet(str(tmp_path / "out2" / "f-0.tar"))] == ["1", "2"]  # relative to their folder


def test_derived_keys_are_made_unique_and_unsafe_keys_are_refused(tmp_path):
    root = tmp_path / "images"
    (root / "k").mkdir(parents=True)
    for name in ("x.jpg", "x.png", "x-2.jpg", "a.b.jpg", "a_b.jpg"):
        (root / "k" / name).write_bytes(image_bytes("JPEG", 0))
    assert [s.key for s in samples_from_folder(root)] == ["k/a_b", "k/a_b-2", "k/x-2", "k/x", "k/x-3"]
    for key in ("/etc/passwd", "../x", "a/../../x", "a//b", "a/b.c", "__meta__/x", "a\\b", ""):
        with pytest.raises(BuildError, match="key"):
            check_key(key, "somewhere")
    assert check_key("a.b/c", "") == "a.b/c"


def s3_env():
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    env.pop("AWS_PROFILE", None)
    return env


@pytest.fixture
def server(s3_store):
    from hydrax.shards import S3Options

    endpoint, client = s3_store
    return S3Options(endpoint_url=endpoint, **KEYS), client


@pytest.mark.slow
def test_s3_output_uploads_shards_with_index_objects_and_refuses_to_overwrite(folder, server, tmp_path):
    root, files = folder
    options, client = server
    pattern = "s3://data/sets/train-%04d.tar"
    result = hydrax(root, pattern, "--maxcount", 4, "--endpoint-url", options.endpoint_url, env=s3_env())
    assert result.returncode == 0, result.stderr
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="data")["Contents"])
    # each shard with its index object, so ShardSet sets up without reading the shards
    assert keys == ["sets/hydrax-index.json", "sets/train-0000.tar", "sets/train-0000.tar.hidx", "sets/train-0001.tar",
                    "sets/train-0001.tar.hidx"]
    summary = json.loads(client.get_object(Bucket="data", Key="sets/hydrax-index.json")["Body"].read())
    assert [(e["url"], e["nsamples"]) for e in summary["shardlist"]] == [("train-0000.tar", 4), ("train-0001.tar", 2)]
    etag = client.head_object(Bucket="data", Key="sets/train-0001.tar")["ETag"]
    index = ShardIndex.from_bytes(client.get_object(Bucket="data", Key="sets/train-0001.tar.hidx")["Body"].read())
    assert index.etag == etag and len(index) == 2
    remote = ShardSet("s3://data/sets/train-{0000..0001}.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    assert [(s.key, bytes(s[field])) for s, (_, field, *_) in zip(remote, EXPECTED)] == [(k, files[p]) for k, _, p, *_ in EXPECTED]
    build_shards(samples_from_folder(root), str(tmp_path / "local-%04d.tar"), maxcount=4)
    assert client.get_object(Bucket="data", Key="sets/train-0001.tar")["Body"].read() == (tmp_path / "local-0001.tar").read_bytes()
    again = hydrax(root, pattern, "--endpoint-url", options.endpoint_url, env=s3_env())
    assert again.returncode == 1 and "s3://data/sets/train-0000.tar: exists" in again.stderr and "--force" in again.stderr
    forced = hydrax(root, pattern, "--force", "-q", "--endpoint-url", options.endpoint_url, env=s3_env())
    assert forced.returncode == 0, forced.stderr
    assert "2 files of the pattern from before remain (s3://data/sets/train-0001.tar" in forced.stderr
    (root / "cat" / "zz.jpg").write_bytes(image_bytes("JPEG", 9)[:300])  # fails after three shards are uploaded
    broken = hydrax(root, "s3://data/other/t-%d.tar", "--maxcount", 1, "--endpoint-url", options.endpoint_url, env=s3_env())
    assert broken.returncode == 1 and "cat/zz.jpg: not a readable image" in broken.stderr
    assert not any(o["Key"].startswith("other/") for o in client.list_objects_v2(Bucket="data")["Contents"])
    missing = hydrax(root, "s3://nobucket/t-%d.tar", "--endpoint-url", options.endpoint_url, env=s3_env())
    assert missing.returncode == 1 and "'nobucket' does not exist" in missing.stderr


def test_sizes_records_each_samples_image_size_in_the_indexes_and_says_how_many(folder, server, tmp_path):
    from hydrax.shards.sizecolumn import SizeCounts

    root, _ = folder
    result = hydrax(root, tmp_path / "out" / "train-%03d.tar", "--maxcount", 4, "--sizes", "JPG")
    assert result.returncode == 0, result.stderr
    assert ("image sizes of field 'jpg': 3 samples with a size, 3 recorded as 0x0 (3 without the field, 0 whose header "
            "could not be read)") in result.stdout
    widths, heights = ShardSet(str(tmp_path / "out" / "train-*.tar"), cache_dir=str(tmp_path / "cache")).image_sizes()
    assert list(zip(widths.tolist(), heights.tolist())) == [(12, 8) if field == "jpg" else (0, 0) for _, field, *_ in EXPECTED]
    report = build_shards(samples_from_folder(root), str(tmp_path / "py" / "s-%d.tar"), sizes="png")
    assert report.size_counts == SizeCounts(2, 4, 0) and ShardIndex.load(report.shards[0] + ".hidx").sizes.field == "png"
    options, client = server
    remote = hydrax(root, "s3://data/sized/t-%d.tar", "--sizes", "jpeg", "--endpoint-url", options.endpoint_url, env=s3_env())
    assert remote.returncode == 0 and "'jpeg': 1 samples with a size, 5 recorded as 0x0" in remote.stdout, remote.stderr
    index = ShardIndex.from_bytes(client.get_object(Bucket="data", Key="sized/t-0.tar.hidx")["Body"].read())
    assert index.sizes.field == "jpeg" and index.sizes.widths.tolist() == [0, 0, 12, 0, 0, 0]


@pytest.mark.slow
def test_an_unreachable_endpoint_is_named(folder, tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = hydrax(folder[0], "s3://data/x/t-%d.tar", "--endpoint-url", f"http://127.0.0.1:{port}", env=s3_env())
    assert result.returncode == 1
    assert f"listing 's3://data/x/': cannot reach the S3 endpoint http://127.0.0.1:{port}" in result.stderr


BAD_INPUTS = {  # name: (how to spoil the input, the output pattern, what the message must say)
    "unreadable file": (lambda root: os.symlink(root / "gone.jpg", root / "dog" / "z.jpg"), "t-%02d.tar",
                        "cannot read {root}/dog/z.jpg: No such file"),
    "non-image": (lambda root: (root / "emu" / "notes.txt").write_text("hi"), "t-%02d.tar",
                  "{root}/emu/notes.txt: not an image (its extension is .txt)"),
    "corrupt image": (lambda root: (root / "emu" / "f.jpg").write_bytes(image_bytes("JPEG", 1)[:200]), "t-%02d.tar",
                      "{root}/emu/f.jpg: not a readable image"),
    "no label": (lambda root: (root / "loose.jpg").write_bytes(image_bytes("JPEG", 1)), "t-%02d.tar",
                 "{root}/loose.jpg: lies directly in the image folder"),
    "brace pattern": (lambda root: None, "t-{000..}.tar", "must hold exactly one number field such as %06d"),
    "no number": (lambda root: None, "t.tar", "must hold exactly one number field such as %06d"),
    "compressed": (lambda root: None, "t-%d.tar.gz", "must end in .tar"),
    # verify --decode and the loaders refuse it: a build must too
    "grey profile on an RGB image": (lambda root: (root / "emu" / "g.jpg").write_bytes(image_bytes("JPEG", 2, profile="Gray")),
                                     "t-%02d.tar", "{root}/emu/g.jpg: not a readable image"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_image_folders_fail_naming_the_file_and_leave_no_shard(folder, tmp_path, case):
    root, _ = folder
    spoil, pattern, message = BAD_INPUTS[case]
    spoil(root)
    out = tmp_path / "out"
    result = hydrax(root, out / pattern, "--maxcount", 1, "--workers", 2)  # later shards fail after earlier ones are done
    assert result.returncode == 1, result.stderr
    assert message.format(root=root) in result.stderr
    assert shards_in(out) == []  # nothing left, not even the temporary folder or the output folder's contents


def test_skip_bad_skips_with_a_warning(folder, tmp_path):
    root, _ = folder
    (root / "emu" / "notes.txt").write_text("hi")
    (root / "emu" / "f.jpg").write_bytes(image_bytes("JPEG", 1)[:200])
    result = hydrax(root, tmp_path / "out" / "t-%d.tar", "--skip-bad")
    assert result.returncode == 0, result.stderr
    assert "warning: skipping" in result.stderr and "notes.txt: not an image" in result.stderr
    assert "f.jpg: not a readable image" in result.stderr and "(6 samples, 1 skipped" in result.stdout
    unchecked = hydrax(root, tmp_path / "out2" / "t-%d.tar", "--skip-bad", "--no-check-images")
    assert unchecked.returncode == 0 and "(7 samples" in unchecked.stdout  # the broken JPEG goes in as it is


def test_an_existing_output_is_refused_unless_forced(folder, tmp_path):
    root, _ = folder
    out = tmp_path / "out"
    out.mkdir()
    (out / "t-07.tar").write_bytes(b"old")
    result = hydrax(root, out / "t-%02d.tar")
    assert result.returncode == 1 and f"{out}/t-07.tar: exists" in result.stderr
    assert shards_in(out) == ["t-07.tar"] and (out / "t-07.tar").read_bytes() == b"old"
    forced = hydrax(root, out / "t-%02d.tar", "--force")
    assert forced.returncode == 0 and "t-07.tar, ...): delete them" in forced.stderr
    assert shards_in(out) == ["t-00.tar", "t-00.tar.hidx", "t-07.tar"]
    inside = hydrax(root, root / "shards" / "t-%d.tar")
    assert inside.returncode == 1 and "lies inside the image folder" in inside.stderr and not (root / "shards").exists()


MANIFESTS = {  # name: (file name, text, extra arguments, what the message must say; {m} is the manifest's folder)
    "empty label": ("m.csv", "image,label\nimg/0.jpg,1\nimg/1.jpg,\n", [], "{m}/m.csv line 3: column 'label' is empty"),
    "mixed labels": ("m.jsonl", '{"image": "img/0.jpg", "label": 1}\n{"image": "img/1.jpg", "label": "cat"}\n', [],
                     "{m}/m.jsonl line 2: column 'label' holds text, but a number on line 1"),
    "missing label": ("m.jsonl", '{"image": "img/0.jpg", "label": 1}\n{"image": "img/1.jpg"}\n', [],
                      "{m}/m.jsonl line 2: has different keys from line 1; lacks 'label'"),
    "escaping path": ("m.csv", "image,label\nimg/0.jpg,1\n../../etc/passwd,2\n", ["--file-column", "image=jpg"],
                      "{m}/m.csv line 3: file '{m}/../../etc/passwd' lies outside {m}, so its key would escape the output folder"),
    "absolute key": ("m.csv", "__key__,image\nok,img/0.jpg\n/etc/passwd,img/1.jpg\n", [],
                     "{m}/m.csv line 3: key '/etc/passwd' is absolute"),
    "escaping key": ("m.csv", "__key__,image\nok,img/0.jpg\na/../../b,img/1.jpg\n", [],
                     "{m}/m.csv line 3: key 'a/../../b' has an empty, '.' or '..' part"),
    "missing file": ("m.csv", "image,label\nimg/0.jpg,1\nimg/9.jpg,2\n", ["--maxcount", "1"],
                     "cannot read {m}/img/9.jpg ({m}/m.csv line 3): No such file"),
    "no file column": ("m.csv", "image,label\nnothing.jpg,1\n", [], "{m}/m.csv line 2: no column names an existing file"),
}


@pytest.mark.parametrize("case", sorted(MANIFESTS))
def test_bad_manifests_fail_naming_the_row_and_leave_no_shard(tmp_path, case):
    manifest_files(tmp_path)
    name, text, extra, message = MANIFESTS[case]
    (tmp_path / "m" / name).write_text(text)
    result = hydrax(tmp_path / "m" / name, tmp_path / "out" / "t-%d.tar", *extra)
    assert result.returncode == 1, result.stderr
    assert message.format(m=tmp_path / "m") in result.stderr
    assert shards_in(tmp_path / "out") == []


def test_an_interrupted_build_removes_what_it_wrote(folder, tmp_path):
    root, _ = folder
    done = []

    def interrupt_at_the_fifth(count):
        done.append(count)
        if len(done) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_shards(samples_from_folder(root), str(tmp_path / "out" / "t-%d.tar"), maxcount=2, workers=2, progress=interrupt_at_the_fifth)
    assert shards_in(tmp_path / "out") == []


def test_help_explains_with_an_example():
    result = hydrax("--help")
    assert result.returncode == 0
    assert "image folder" in result.stdout and "examples:\n  hydrax shards build photos/ out/train-%06d.tar" in result.stdout


def test_help_says_what_the_build_does_with_indexes():
    """It used to say that the indexes of s3:// shards are not uploaded; the build uploads an
    index object per shard and updates the folder summary."""
    text = " ".join(hydrax("--help").stdout.split())
    assert "not uploaded" not in text
    assert "an index object beside the shard" in text and "the folder summary (hydrax-index.json)" in text


@pytest.mark.parametrize("pattern", ["ftp://h/x-%04d.tar", "gs2://b/x-%04d.tar"])
def test_an_unsupported_scheme_is_refused_and_writes_nothing(folder, tmp_path, pattern):
    """It once wrote ./ftp:/h/x-0000.tar and exited 0."""
    root, _ = folder
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run([sys.executable, "-m", "hydrax", "shards", "build", str(root), pattern], capture_output=True,
                            text=True, timeout=slack(120), cwd=work)
    scheme = pattern.partition("://")[0]
    assert result.returncode == 1 and f"the {scheme}:// scheme is not supported" in result.stderr
    assert list(work.iterdir()) == []
    with pytest.raises(StoreError, match="scheme is not supported"):
        build_shards(samples_from_folder(root), pattern)


def test_a_file_url_pattern_writes_local_shards(folder, tmp_path):
    root, _ = folder
    summary = build_shards(samples_from_folder(root), f"file://{tmp_path}/out/t-%02d.tar")
    assert summary and sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix == ".tar")


@pytest.mark.parametrize("workers, stop", [(1, "SIGINT"), (2, "SIGINT"), (2, "SIGTERM")])
def test_ctrl_c_or_sigterm_through_the_command_removes_what_the_build_wrote(tmp_path, workers, stop):
    import signal
    import time

    src = tmp_path / "src"
    src.mkdir()
    files = [src / f"s{i:03d}.bin" for i in range(201)]
    for path in files[:-1]:
        path.write_bytes(b"x" * 100)
    os.mkfifo(files[-1])  # reading it blocks until someone writes: the build stalls there, for good
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "hydrax", "shards", "build", *map(str, files), str(out / "t-%d.tar"),
                                "--maxcount", "50", "--workers", str(workers)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + slack(60)
        while not (out / "t-2.tar").exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.02)
        assert (out / "t-2.tar").exists()  # complete shards under their final names...
        process.send_signal(getattr(signal, stop))
        _, stderr = process.communicate(timeout=slack(60))
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130 and "hydrax: interrupted" in stderr
    assert "Traceback" not in stderr and "Process" not in stderr  # the workers stop quietly
    assert shards_in(out) == []  # ...are gone again, with the shard in progress and the temporary folder
