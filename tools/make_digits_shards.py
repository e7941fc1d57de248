"""Rebuild ``shards/``: the UCI handwritten digits as PNG tar shards, with the ``hydrax`` command.

    pip install scikit-learn && python tools/make_digits_shards.py

The 1,797 8x8 images that scikit-learn ships (``sklearn.datasets.load_digits``; pixel values
0-16) are written as 8-bit grayscale PNGs (value * 255 // 16) into a class-per-subfolder tree,
every 6th image (300) to ``val/`` and the rest (1,497) to ``train/``, then turned into shards by
``hydrax shards build`` (shuffled with seed 0, so classes mix within shards and the output is
byte-identical on every run). The demo
(``make demo``) reads them; scikit-learn is needed only here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shards")


def main() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images.astype(np.int64) * 255 // 16).astype(np.uint8)
    with tempfile.TemporaryDirectory() as folder:
        for i, (image, label) in enumerate(zip(images, digits.target)):
            split = "val" if i % 6 == 0 else "train"
            path = os.path.join(folder, split, str(label))
            os.makedirs(path, exist_ok=True)
            Image.fromarray(image, "L").save(os.path.join(path, f"digit{i:04d}.png"), optimize=True)
        for split, maxcount in (("train", 400), ("val", 400)):
            pattern = os.path.join(ROOT, f"digits-{split}-%02d.tar")
            subprocess.run([sys.executable, "-m", "hydrax", "shards", "build", os.path.join(folder, split), pattern,
                            "--maxcount", str(maxcount), "--shuffle", "--seed", "0", "--force", "--quiet"], check=True)
    print(f"wrote the digits shards into {os.path.normpath(ROOT)}")


if __name__ == "__main__":
    main()
