"""A command that fails before writing anything leaves none of the folders it created
(``fileio.created_folders_removed_when_empty``); folders that were there, and anything with
content, stay."""

from __future__ import annotations

import pytest

from transformer_nmt.fileio import created_folders_removed_when_empty


def test_empty_folders_it_created_are_removed_and_the_users_kept(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine\n")
    orig = tmp_path / "data" / "raw" / "wmt14_en_de" / "orig"
    with pytest.raises(RuntimeError), created_folders_removed_when_empty(orig):
        orig.mkdir(parents=True)
        raise RuntimeError("no network")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["notes.txt"]


def test_a_folder_with_content_is_kept_with_the_folders_above(tmp_path):
    orig = tmp_path / "data" / "raw" / "wmt14_en_de" / "orig"
    with pytest.raises(RuntimeError), created_folders_removed_when_empty(orig):
        orig.mkdir(parents=True)
        (orig / "train.en.partial").write_text("a resumable stream\n")
        raise RuntimeError("connection reset")
    assert (orig / "train.en.partial").is_file()


def test_a_success_keeps_what_was_written(tmp_path):
    orig = tmp_path / "data" / "raw" / "c" / "orig"
    with created_folders_removed_when_empty(orig):
        (tmp_path / "data" / "raw" / "c").mkdir(parents=True)
        (tmp_path / "data" / "raw" / "c" / "train.en").write_text("text\n")
    assert (tmp_path / "data" / "raw" / "c" / "train.en").is_file() and not orig.exists()
