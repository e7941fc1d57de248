"""The pages that describe the code's layout (docs/contributing.rst and docs/design.rst) match the
tree: every module and kernel file is named on the contributor's map, and every file either
page names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hydrax"
MAP = ROOT / "docs" / "contributing.rst"
DESIGN = ROOT / "docs" / "design.rst"
#: The files that make up the package's code: modules, the kernels and their C headers.
SUFFIXES = (".py", ".pyx", ".pxi", ".h", ".pyi")
#: A literal that names a file: ``path/name.py`` (or .pyx, .pxi, .h, .pyi).
FILE_LITERAL = re.compile(r"``([\w./-]+\.(?:pyx|pxi|pyi|py|h))``")


def package_files() -> list[str]:
    """Every code file of the package, relative to ``hydrax/``, but a subpackage's ``__init__.py``
    (the subpackage is named instead, as ``order/``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*")):
        relative = path.relative_to(PACKAGE).as_posix()
        if path.suffix not in SUFFIXES or "__pycache__" in relative or path.name.startswith("_core.c"):
            continue
        found.append(f"{path.parent.relative_to(PACKAGE).as_posix()}/" if path.name == "__init__.py" and path.parent != PACKAGE
                     else relative)
    return found


def test_every_module_and_kernel_file_is_on_the_map():
    text = MAP.read_text()
    named = set(FILE_LITERAL.findall(text)) | set(re.findall(r"``(?:hydrax/)?([\w/]+/)``", text))
    assert [f for f in package_files() if f not in named] == []


def test_every_file_the_pages_name_exists():
    missing = []
    for page in (MAP, DESIGN):
        for name in FILE_LITERAL.findall(page.read_text()):
            if not any((base / name).exists() for base in (ROOT, PACKAGE, ROOT / "tests")):
                missing.append(f"{page.name}: {name}")
    assert missing == []


def test_the_design_page_names_every_kernel_family():
    text = DESIGN.read_text()
    kernels = sorted(p.name for p in PACKAGE.glob("*") if p.suffix in (".pxi", ".h"))
    assert [k for k in kernels if f"``{k}``" not in text] == []
