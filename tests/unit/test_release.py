"""A machine's release files (llmgw/release.py): judged by sha256, received only whole and checked, kept beside
the running one, and the one ran before remembered for `ctl upgrade --rollback`."""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from pathlib import Path

import pytest

from llmgw import release
from llmgw.release import ReleaseError, Running


def zipapp(path: Path, main: str = "print('hello')\n") -> Path:
    """A small zipapp: what the release code needs to see (a zip archive with a __main__.py)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("__main__.py", main)
    path.write_bytes(buffer.getvalue())
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_zipapp_is_hashed_and_anything_else_is_not_a_zipapp(tmp_path: Path) -> None:
    app = zipapp(tmp_path / "llmgw.pyz")
    assert release.of_file(str(app)) == Running(app.resolve(), sha(app))
    (tmp_path / "script.py").write_text("print(1)\n")
    for other in (str(tmp_path / "script.py"), str(tmp_path / "missing.pyz"), "", "-c"):
        found = release.of_file(other)
        assert found.path is None and found.sha256 is None and found.reason == release.NOT_A_ZIPAPP
    assert release.of_file(str(app)).to_doc() == {"file": str(app.resolve()), "sha256": sha(app),
                                                  "sha256_reason": None}


def test_the_running_release_is_hashed_once_at_start(tmp_path: Path) -> None:
    # Under pytest this process runs no zipapp: it says so rather than reporting a hash of something else.
    assert release.running().sha256 is None and release.running().reason == release.NOT_A_ZIPAPP


def test_a_received_file_is_kept_only_whole(tmp_path: Path) -> None:
    app = zipapp(tmp_path / "new.pyz")
    data, digest = app.read_bytes(), sha(app)
    dest = tmp_path / "bin"
    cut = release.Receiver(dest, dest / "llmgw-x.pyz", digest)
    cut.write(data[: len(data) // 2])
    with pytest.raises(ReleaseError) as refused:
        cut.finish()
    assert refused.value.code == "sha256_mismatch" and "nothing was kept" in refused.value.message
    assert list(dest.iterdir()) == []  # no partial file, no hidden one left

    whole = release.Receiver(dest, dest / "llmgw-x.pyz", digest)
    whole.write(data)
    path = whole.finish()
    assert path == dest / "llmgw-x.pyz" and sha(path) == digest
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert [p.name for p in dest.iterdir()] == ["llmgw-x.pyz"]


def test_a_file_that_is_not_a_zipapp_or_too_large_is_refused(tmp_path: Path) -> None:
    text = b"#!/bin/sh\necho not a zipapp\n"
    receiver = release.Receiver(tmp_path, tmp_path / "x.pyz", hashlib.sha256(text).hexdigest())
    receiver.write(text)
    with pytest.raises(ReleaseError) as refused:
        receiver.finish()
    assert refused.value.code == "not_a_zipapp"
    small = release.Receiver(tmp_path, tmp_path / "y.pyz", "0" * 64, limit=10)
    with pytest.raises(ReleaseError) as large:
        small.write(b"x" * 11)
    assert large.value.code == "release_too_large"
    assert list(tmp_path.iterdir()) == []


def test_what_an_upgrade_asks_is_checked() -> None:
    runs = Running(Path("/opt/llmgw.pyz"), "a" * 64)
    assert release.target_of({"sha256": "b" * 64}, runs) == ("b" * 64, False)
    assert release.target_of({"rollback": True}, runs) == ("", True)
    for bad in (None, [], {}, {"sha256": "b" * 64, "rollback": True}, {"rollback": False}, {"rollback": "yes"},
                {"sha256": "B" * 64}, {"sha256": "b" * 63}, {"sha256": 1}, {"version": "0.2.0"}):
        with pytest.raises(ReleaseError) as refused:
            release.target_of(bad, runs)
        assert refused.value.code in ("invalid_request", "invalid_sha256"), bad
    with pytest.raises(ReleaseError) as package:
        release.target_of({"sha256": "b" * 64}, Running(None, None, release.NOT_A_ZIPAPP))
    assert package.value.code == "not_a_zipapp" and "not a zipapp" in package.value.message


def test_an_upgrade_takes_the_running_path_keeps_both_beside_it_and_a_rollback_goes_back(tmp_path: Path) -> None:
    """The path a service starts holds the release running now, so a later restart by the service (systemd,
    the supervisor) runs the upgrade, not the file installed first; both are kept under their own names."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    old = zipapp(bin_dir / "llmgw.pyz", "print('old')\n")
    old_sha = sha(old)
    upload = zipapp(tmp_path / "upload.pyz", "print('new')\n")
    now = Running(old, old_sha)
    with pytest.raises(ReleaseError) as never:
        release.previous(state)
    assert never.value.code == "no_previous_release"

    path, new_sha = release.prepare(state, now, upload, sha(upload), False)
    assert path == old and new_sha == sha(upload) and sha(path) == sha(upload)  # the service's path runs the new one
    kept_old, kept_new = bin_dir / release.file_name(old_sha), bin_dir / release.file_name(new_sha)
    assert sha(kept_old) == old_sha and sha(kept_new) == new_sha  # both kept beside it
    assert release.previous(state) == (kept_old, old_sha)

    # Running the new one (from the same path), a rollback puts the old one back there, and remembers the new one.
    back, back_sha = release.prepare(state, Running(path, new_sha), None, "", True)
    assert (back, back_sha) == (old, old_sha) and sha(old) == old_sha
    assert release.previous(state) == (kept_new, new_sha)
    assert sorted(p.name for p in bin_dir.iterdir()) == sorted(["llmgw.pyz", kept_old.name, kept_new.name])


def test_a_machine_that_runs_a_kept_release_runs_the_next_one_beside_it(tmp_path: Path) -> None:
    """Its own file is the rollback's copy: never overwritten."""
    app = zipapp(tmp_path / "seed.pyz", "print('old')\n")
    old = tmp_path / release.file_name(sha(app))
    app.rename(old)
    upload = zipapp(tmp_path / "upload.pyz", "print('new')\n")
    (tmp_path / "state").mkdir()
    path, new_sha = release.prepare(tmp_path / "state", Running(old, sha(old)), upload, sha(upload), False)
    assert path == tmp_path / release.file_name(new_sha) and sha(old) != new_sha
    assert release.previous(tmp_path / "state") == (old, sha(old))


def test_a_previous_file_changed_since_is_no_rollback(tmp_path: Path) -> None:
    old = zipapp(tmp_path / "llmgw.pyz")
    new = zipapp(tmp_path / "new.pyz", "print('new')\n")
    release.record_switch(tmp_path, Running(old, sha(old)), new, sha(new))
    zipapp(old, "print('replaced by hand')\n")
    with pytest.raises(ReleaseError) as refused:
        release.previous(tmp_path)
    assert refused.value.code == "no_previous_release" and "changed" in refused.value.message
