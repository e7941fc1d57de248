"""``hydrax demo`` as a user runs it: from a wheel installed outside the checkout, where there is
no ``shards/`` folder, and from a checkout.

The wheel is built once for this module (``pip wheel`` compiles the Cython extension in an
isolated build environment: about 20-25 s on 2 cores, plus a download of the build requirements
on a machine whose pip cache lacks them); each demo run takes about 5 s.
"""

import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("PIL")
pytest.importorskip("tqdm")


def _copy_source(target: Path) -> None:
    """What a wheel is built from: the project files and the package, without build outputs."""
    target.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "hydrax", target / "hydrax",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "_core.c", "*.egg-info"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel of this checkout, and the folder it is installed into (``pip install --target``)."""
    base = tmp_path_factory.mktemp("wheel")
    _copy_source(base / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(base / "dist"), str(base / "src")],
                           capture_output=True, text=True, timeout=slack(900))
    assert built.returncode == 0, built.stdout + built.stderr
    [path] = (base / "dist").glob("hydrax-*.whl")
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target",
                                str(base / "site"), str(path)], capture_output=True, text=True, timeout=slack(300))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return path, base / "site"


def _run_installed(site: Path, cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in ``cwd`` with the installed wheel first on the path (ahead of the
    checkout's editable install) and ``HYDRAX_CACHE=cache``."""
    env = dict(os.environ, PYTHONPATH=str(site), HYDRAX_CACHE=str(cache))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=slack(300))


@pytest.mark.wheel
def test_demo_runs_from_an_installed_wheel(wheel, tmp_path):
    _, site = wheel
    elsewhere, cache = tmp_path / "elsewhere", tmp_path / "cache"
    elsewhere.mkdir()
    first = _run_installed(site, elsewhere, cache, "-m", "hydrax", "demo", "--epochs", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    [folder] = (cache / "demo").iterdir()  # the shards, built on first use (and nothing left half-built)
    assert folder.name.startswith("digits-")
    assert f"[demo] built the digit shards from the digits shipped with hydrax into {folder}" in first.stdout
    assert f"[demo] 1497 training and 300 validation digits in 5 shards ({folder}); 2 loader processes" in first.stdout
    assert "final parameters bit-identical to the uninterrupted run: True" in first.stdout
    assert first.stdout.rstrip().splitlines()[-1].startswith("[demo] OK: final validation accuracy ")
    assert sorted(p.name for p in folder.glob("*.tar")) == [f"digits-train-0{i}.tar" for i in range(4)] + ["digits-val-00.tar"]
    # the next run finds them in the cache; and the hydrax that runs is the wheel's, not the checkout's
    second = _run_installed(site, elsewhere, cache, "-c", "import sys, hydrax, hydrax._core, hydrax.cli; print(hydrax.__file__, "
                            "hydrax._core.__file__); sys.exit(hydrax.cli.main(['demo', '--epochs', '1']))")
    assert second.returncode == 0, second.stdout + second.stderr
    assert all(Path(name).is_relative_to(site) for name in second.stdout.splitlines()[0].split()), second.stdout
    assert "built the digit shards" not in second.stdout and f"5 shards ({folder})" in second.stdout
    assert [p.name for p in (cache / "demo").iterdir()] == [folder.name]


@pytest.mark.wheel
def test_the_wheel_ships_the_digits_and_not_the_shards(wheel):
    path, _ = wheel
    with zipfile.ZipFile(path) as archive:
        sizes = {info.filename: info.file_size for info in archive.infolist()}
    assert 0 < sizes["hydrax/demo_digits.npz"] < 100_000
    assert not [name for name in sizes if name.endswith((".tar", ".hidx"))]


def test_the_shipped_digits_build_the_repository_shards(tmp_path):
    """write_digits_shards writes the shards of shards/ (same samples, order, labels and pixels)."""
    from PIL import Image

    from hydrax.demo import load_digits, write_digits_shards
    from hydrax.shards import ShardSet

    images, labels = load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,) and images.max() == 16
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    paths = write_digits_shards(tmp_path)
    assert [Path(p).name for p in paths] == [f"digits-train-0{i}.tar" for i in range(4)] + ["digits-val-00.tar"]
    for split in ("train", "val"):
        built = ShardSet(str(tmp_path / f"digits-{split}-*.tar"))
        bundled = ShardSet(str(ROOT / "shards" / f"digits-{split}-*.tar"), write_index=False)
        assert len(built) == len(bundled) == (1497 if split == "train" else 300)
        for i in range(len(built)):
            ours, theirs = built[i], bundled[i]
            assert ours.key == theirs.key and set(ours.fields) == set(theirs.fields) == {"png", "cls", "label"}
            assert bytes(ours["cls"]) == bytes(theirs["cls"]) and bytes(ours["label"]) == bytes(theirs["label"])
            pixels = [np.asarray(Image.open(io.BytesIO(bytes(s["png"])))) for s in (ours, theirs)]
            assert np.array_equal(*pixels), ours.key
            number = int(ours.key.rsplit("digit", 1)[1])
            assert np.array_equal(pixels[0], (images[number].astype(int) * 255 // 16).astype(np.uint8))
            assert int(bytes(ours["cls"])) == labels[number] and (number % 6 == 0) == (split == "val")


@pytest.mark.slow
def test_demo_says_why_it_cannot_find_shards(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hydrax", "demo", "--shards", str(tmp_path / "nowhere")],
                            capture_output=True, text=True, timeout=slack(120), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("[demo] ") and str(tmp_path / "nowhere") in result.stderr, result.stderr
    assert "pass --shards a folder with digits-{train,val}-*.tar" in result.stderr
