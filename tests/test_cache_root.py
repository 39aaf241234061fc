"""The cache root and its atomic writes (inflight/cache_root.py): a write replaces the
whole file or nothing, and a failed one leaves no temporary file behind."""
import pytest

from inflight.cache_root import cache_root, write_atomic


def test_the_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == str(tmp_path / "c")
    assert cache_root(str(tmp_path / "given")) == str(tmp_path / "given")


def test_write_replaces_the_file_and_makes_its_folder(tmp_path):
    path = tmp_path / "sub" / "entry.json"
    write_atomic(str(path), "one")
    write_atomic(str(path), "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["entry.json"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "entry.json"
    target.mkdir()  # a folder where the file should go: the rename fails
    (target / "x").write_text("keep")
    with pytest.raises(OSError):
        write_atomic(str(target), "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.json"]
