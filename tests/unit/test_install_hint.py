"""The fix a missing llama.cpp engine names depends on how llmgw runs: an installed
package takes the extra, a zipapp (its packages inside the file) is rebuilt."""

from __future__ import annotations

import zipfile
from pathlib import Path

from llmgw.engines.llamacpp import not_installed


def test_an_installed_llmgw_is_told_to_install_the_extra() -> None:
    assert not_installed(argv0="") == "llama.cpp engine not installed: pip install 'llmgw[llamacpp]'"


def test_a_zipapp_is_told_to_rebuild_with_the_engine(tmp_path: Path) -> None:
    pyz = tmp_path / "llmgw.pyz"
    with zipfile.ZipFile(pyz, "w") as z:
        z.writestr("__main__.py", "")
    hint = not_installed(argv0=str(pyz))
    assert "python build.py --with-llamacpp" in hint
    assert "pip install" not in hint
