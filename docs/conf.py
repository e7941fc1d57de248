"""Sphinx configuration for the hydrax documentation (``make docs``)."""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)


def _version() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        match = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.MULTILINE)
    return match.group(1) if match else "unknown"


project = "hydrax"
author = "the hydrax authors"
copyright = "the hydrax authors. Licensed under the Mozilla Public License 2.0 (MPL-2.0)"
release = _version()
version = ".".join(release.split(".")[:2])

# Docstrings are written with reStructuredText field lists (``:param name:``, ``:raises X:``),
# which autodoc understands directly; napoleon (Google/NumPy style) is deliberately not used.
extensions = ["sphinx.ext.autodoc"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
autoclass_content = "class"

templates_path: list[str] = []
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []
html_title = f"hydrax {release}"


def _command_help(command: str) -> str:
    """The ``--help`` text of ``hydrax COMMAND`` (words separated by spaces), as the CLI prints it."""
    import argparse

    from hydrax.cli import parser

    current: argparse.ArgumentParser = parser()
    for word in command.split():
        actions = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        current = actions[0].choices[word]
    os.environ.setdefault("COLUMNS", "100")
    return current.format_help()


def setup(app):
    """The ``hydrax-help`` directive: a subcommand's help, generated from the parser itself."""
    from docutils import nodes
    from docutils.parsers.rst import Directive

    class HydraxHelp(Directive):
        required_arguments = 1
        final_argument_whitespace = True

        def run(self):
            text = _command_help(self.arguments[0])
            return [nodes.literal_block(text, text)]

    app.add_directive("hydrax-help", HydraxHelp)
