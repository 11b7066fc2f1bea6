"""Build `dist/llmgw.pyz`, the one-file zipapp every machine runs (shiv).

    python build.py                  # runtime dependencies only
    python build.py --with-llamacpp  # plus the llama.cpp CPU engine (xllamacpp)

Uses the shiv of the interpreter running this script (`pip install -e '.[build]'`).
Bytecode is compiled into the archive (`--compile-pyc`): machines here set
PYTHONDONTWRITEBYTECODE=1, so without it every start recompiles (~2x slower).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def shiv_command(output: Path, *, with_llamacpp: bool) -> list[str]:
    # "." installs the project with its runtime dependencies; test and build extras stay out.
    target = ".[llamacpp]" if with_llamacpp else "."
    return [
        sys.executable, "-m", "shiv",
        "--compile-pyc",
        "-c", "llmgw",
        "-o", str(output),
        "--python", "/usr/bin/env python3",
        target,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the llmgw zipapp with shiv.")
    parser.add_argument(
        "--with-llamacpp",
        action="store_true",
        help="include the llamacpp extra (xllamacpp, ~100 MB); the SmolLM2 weights stay out",
    )
    parser.add_argument("-o", "--output", type=Path, default=Path("dist/llmgw.pyz"), help="default: dist/llmgw.pyz")
    args = parser.parse_args(argv)

    if importlib.util.find_spec("shiv") is None:
        print(
            f"error: shiv is not installed for {sys.executable}; run `make venv` "
            "(or pip install -e '.[build]') and build with .venv/bin/python build.py",
            file=sys.stderr,
        )
        return 2
    output = args.output if args.output.is_absolute() else ROOT / args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    command = shiv_command(output, with_llamacpp=args.with_llamacpp)
    print("+", " ".join(command), flush=True)
    started = time.monotonic()
    # pip builds the wheel in-tree; setuptools' build/ never forgets a deleted
    # module, which would then ship in the archive.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    try:
        done = subprocess.run(command, cwd=ROOT)
    finally:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        print(f"error: shiv failed (exit {done.returncode}) after {elapsed:.1f} s", file=sys.stderr)
        return 1
    size = output.stat().st_size
    print(
        f"built {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}: "
        f"{size / 2**20:.1f} MiB in {elapsed:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
