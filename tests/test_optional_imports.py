"""Optional dependencies: ``import hydrax`` never imports them, and their modules explain how to install them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.timing import slack

#: (package, hydrax module that needs it, installed by the extra ``hydrax[<module>]``)
OPTIONAL = [("tqdm", "tqdm"), ("pandas", "pandas")]


@pytest.mark.parametrize("package, module", OPTIONAL, ids=[p for p, _ in OPTIONAL])
def test_import_hydrax_does_not_import_optional_package(package, module):
    code = f"import sys, hydrax; assert {package!r} not in sys.modules, '{package} imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=slack(60))
    assert result.returncode == 0, result.stderr


def test_import_hydrax_leaves_the_data_sources_and_images_unimported():
    # what a training script that only uses DataGroup pays for: not the shards' stores, not Pillow
    code = ("import sys, hydrax; hydrax.bucket_groups; "
            "print(sorted(m for m in ('hydrax.shards', 'hydrax.image', 'PIL', 'obstore') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=slack(60))
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.parametrize("package, module", OPTIONAL, ids=[p for p, _ in OPTIONAL])
def test_missing_optional_package_gives_install_hint(package, module):
    code = (
        f"import sys; sys.modules[{package!r}] = None\n"
        f"try:\n    import hydrax.{module}\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=slack(60))
    assert f"pip install 'hydrax[{module}]'" in result.stdout, result.stdout + result.stderr


def test_without_simplejpeg_jpegs_take_pillows_path_with_the_same_pixels(tmp_path):
    """simplejpeg comes with the image extra; without it decode_into still works, through Pillow."""
    pytest.importorskip("simplejpeg")
    code = (
        "import io, sys\n"
        "import numpy as np\n"
        "from PIL import Image\n"
        "blocked = len(sys.argv) > 1\n"
        "if blocked: sys.modules['simplejpeg'] = None\n"
        "from hydrax.image import decode_into, jpeg\n"
        "assert (jpeg.simplejpeg is None) == blocked\n"
        "rng = np.random.default_rng(0)\n"
        "buffer = io.BytesIO()\n"
        "Image.fromarray(rng.integers(0, 256, (90, 120, 3), np.uint8)).save(buffer, 'JPEG')\n"
        "slot = np.zeros((3, 40, 40), np.float32)\n"
        "decode_into(buffer.getvalue(), slot, layout='chw', crop='random', flip=True, seed=3)\n"
        "sys.stdout.buffer.write(slot.tobytes())\n"
    )
    results = [subprocess.run([sys.executable, "-c", code, *extra], capture_output=True, timeout=slack(60)) for extra in ([], ["blocked"])]
    for result in results:
        assert result.returncode == 0, result.stderr.decode()
    assert len(results[0].stdout) == 3 * 40 * 40 * 4 and results[0].stdout == results[1].stdout
