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


@pytest.mark.parametrize("package, module", OPTIONAL, ids=[p for p, _ in OPTIONAL])
def test_missing_optional_package_gives_install_hint(package, module):
    code = (
        f"import sys; sys.modules[{package!r}] = None\n"
        f"try:\n    import hydrax.{module}\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=slack(60))
    assert f"pip install 'hydrax[{module}]'" in result.stdout, result.stdout + result.stderr
