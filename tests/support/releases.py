"""A newer release of llmgw, made from this tree for the mixed-version and upgrade tests: a copy of the
`llmgw` package one store level up (docs/operations.md, "Upgrade"), with one new command type.

What the copy changes, each at an anchor that must be found exactly once (a test fails loudly when the
code it patches moves, rather than testing an unchanged copy):
- its version: this one's with `+next`;
- its store level: one above this one's, brought by that version (`llmgw.domain.levels`);
- a new command type `setting.set`, what its `put_setting` writes from then on (applied as
  `setting.put`): a settings write through a leader of the newer release is a command of the new level.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import llmgw
from llmgw.domain import levels

SOURCE = Path(llmgw.__file__).resolve().parent
NEW_OP = "setting.set"
# What a source tree needs for build.py besides the package (pyproject names the readme).
BUILD_FILES = ("pyproject.toml", "README.md", "build.py")


@dataclass(frozen=True)
class Release:
    """A tree holding an `llmgw` package (what PYTHONPATH names), its version and store level."""

    root: Path
    version: str
    level: int


def this_release() -> Release:
    return Release(SOURCE.parent, llmgw.__version__, levels.LEVEL)


def newer_release(dest: Path) -> Release:
    """Copy this tree's `llmgw` under `dest` as the next release (see the module's docstring)."""
    version, level = f"{llmgw.__version__}+next", levels.LEVEL + 1
    package = dest / "llmgw"
    shutil.copytree(SOURCE, package, ignore=shutil.ignore_patterns("__pycache__"))
    _patch(package / "__init__.py", r'__version__ = "[^"]+"', f'__version__ = "{version}"')
    _patch(package / "domain" / "levels.py", r"^LEVEL = \d+$", f"LEVEL = {level}")
    _patch(package / "domain" / "levels.py", r"^RELEASES: Mapping\[int, str\] = \{",
           f'RELEASES: Mapping[int, str] = {{{level}: "{version}", ')
    _patch(package / "domain" / "levels.py", r"^OPS_SINCE: Mapping\[str, int\] = \{",
           f'OPS_SINCE: Mapping[str, int] = {{"{NEW_OP}": {level}, ')
    _patch(package / "domain" / "commands" / "settings.py", r'make\("setting\.put", at,', f'make("{NEW_OP}", at,')
    _patch(package / "domain" / "commands" / "__init__.py",
           r'^    "setting\.put": \(settings\.check_put, settings\.apply_put\),$',
           f'    "setting.put": (settings.check_put, settings.apply_put),\n'
           f'    "{NEW_OP}": (settings.check_put, settings.apply_put),')
    return Release(dest, version, level)


def _patch(path: Path, pattern: str, replacement: str) -> None:
    text = path.read_text()
    new, count = re.subn(pattern, lambda _: replacement, text, flags=re.MULTILINE)
    assert count == 1, f"{path}: {pattern!r} found {count} times (the newer release's patch needs it once)"
    path.write_text(new)


def build_zipapp(tree: Path, out: Path, *extra: str) -> Path:
    """`build.py` of `tree` (this one: SOURCE's parent) into `out`, with `extra` flags (`--with-llamacpp`)."""
    done = subprocess.run([sys.executable, str(tree / "build.py"), "-o", str(out), *extra], cwd=tree,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def newer_tree(dest: Path) -> Release:
    """A source tree of the next release (`newer_release`) with what `build.py` needs beside the package."""
    for name in BUILD_FILES:
        shutil.copy2(SOURCE.parent / name, dest / name)
    return newer_release(dest)
