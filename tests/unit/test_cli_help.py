"""`--help` as a newcomer reads it: every command listed with what it does, every flag
of every command with a description (cyclopts commands and the engines' own parsers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import cyclopts

from llmgw.cli import app

# Wide enough that no row of a help table wraps.
WIDE = {**os.environ, "COLUMNS": "300"}


def llmgw_help(*command: str) -> str:
    out = subprocess.run([sys.executable, "-m", "llmgw", *command, "--help"], capture_output=True, text=True,
                         env=WIDE, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def commands(root: cyclopts.App, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], cyclopts.App]]:
    """Every command under `root` (lazy ones loaded), with the words that name it."""
    yield path, root
    for name in root:
        if name not in root.help_flags and name not in root.version_flags:
            yield from commands(root[name], (*path, name))


def test_the_command_list_says_what_each_command_does() -> None:
    # From a fresh process: the lazily registered commands are listed without being loaded.
    text = llmgw_help()
    rows = {m.group(1): m.group(2).strip(" │") for m in re.finditer(r"^│ (\w[\w-]*) +(.*)$", text, re.M)}
    registered = [name for name in app if name not in app.help_flags and name not in app.version_flags]
    assert set(registered) == {"up", "control", "agent", "gateway", "engine", "ctl", "doctor", "sim-fleet", "stop", "start",
                               "status", "init", "service", "restart", "server"}
    for name in registered:
        assert rows.get(name), f"`llmgw --help` lists {name!r} without a description:\n{text}"


def test_every_flag_of_every_command_has_a_description() -> None:
    undescribed, delegated = [], []
    for path, command in commands(app):
        if command.default_command is None:
            continue
        if not command.help_flags:  # hands its tokens, --help included, to the engine's own parser
            delegated.append(path)
            continue
        for argument in command.assemble_argument_collection(parse_docstring=True):
            if argument.show and not argument.parameter.help:
                undescribed.append(f"llmgw {' '.join(path)} {argument.name}")
    assert not undescribed, "flags without a description in --help:\n" + "\n".join(undescribed)
    assert sorted(delegated) == [("engine", "llama-cpp"), ("engine", "sim")]


def argparse_flags(text: str) -> dict[str, str]:
    """`--flag` -> its description, from argparse's --help (options and the tunables' epilog)."""
    found: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        row = re.match(r"^  (-[^ ,]+)(?:,? [^ ]+)*?(?: {2,}(.*))?$", line)
        if row:
            flag = max(re.findall(r"--?[\w-]+", line.split("  ")[1]), key=len)
            last = flag
            found[flag] = (row.group(2) or "").strip()
        elif last and line.startswith(" " * 8) and line.strip():  # a description on the next line
            found[last] = (found[last] + " " + line.strip()).strip()
        else:
            last = ""
    return found


def test_every_flag_of_each_engine_has_a_description() -> None:
    for engine, expected in (("sim", {"--host", "--port", "--model", "--role", "--tokens-per-s"}),
                             ("llama-cpp", {"--host", "--port", "--model", "--role", "--weights", "--ctx-size"})):
        flags = argparse_flags(llmgw_help("engine", engine))
        assert expected <= set(flags), flags
        undescribed = sorted(flag for flag, words in flags.items() if not words and flag != "--help")
        assert not undescribed, f"llmgw engine {engine}: flags without a description: {undescribed}"


def test_argparse_flags_reads_both_layouts() -> None:
    text = ("options:\n  -h, --help            show this help message and exit\n"
            "  --role {chat,embedding,guard}\n                        guard gives answers\n"
            "  --bare {a,b}\n  --weights WEIGHTS     path of the GGUF file\n")
    assert argparse_flags(text) == {"--help": "show this help message and exit", "--role": "guard gives answers",
                                    "--bare": "", "--weights": "path of the GGUF file"}
