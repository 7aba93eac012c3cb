"""The export folder's own debris: folders left by an export killed before its end are removed
by the next export of that folder, and an export folder reached through a symlink is replaced
where the link points, leaving nothing beside either."""

from __future__ import annotations

import logging

from transformer_nmt.interop.common import EXPORT_MARKER, atomic_export_folder


def _export(out, text: str, overwrite: bool = False) -> None:
    with atomic_export_folder(out, overwrite) as tmp:
        (tmp / "model.txt").write_text(text)


def test_folders_of_a_killed_export_are_removed_by_the_next(tmp_path, caplog):
    out = tmp_path / "export" / "hf"
    out.parent.mkdir()
    killed = [out.parent / ".hf.k3_x9a0q", out.parent / ".hf.old.4242"]
    for folder in killed:
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    lock = out.parent / ".hf.lock"
    lock.write_text("{}")  # the lock of the export that runs now: a file, kept
    other = out.parent / ".hf.notes"  # not a name an export gives its folders: kept
    other.mkdir()
    with caplog.at_level(logging.WARNING):
        _export(out, "new")
    assert (out / "model.txt").read_text() == "new" and (out / EXPORT_MARKER).is_file()
    assert not any(f.exists() for f in killed)
    assert lock.is_file() and other.is_dir()
    assert "left by an export killed before its end" in caplog.text


def test_an_export_folder_behind_a_symlink_is_replaced_where_it_points(tmp_path):
    real = tmp_path / "scratch" / "hf"
    real.parent.mkdir()
    _export(real, "first")
    link = tmp_path / "run" / "export" / "hf"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    _export(link, "second", overwrite=True)
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert (real / "model.txt").read_text() == "second"
    assert sorted(p.name for p in real.parent.iterdir()) == ["hf"]
    assert sorted(p.name for p in link.parent.iterdir()) == ["hf"]
