import os

import pytest

from ds4agent.fsutil import atomic_entry, atomic_file, atomic_write


def test_atomic_write_creates_and_replaces_keeping_mode(tmp_path):
    target = tmp_path / "f.txt"
    atomic_write(target, b"one")
    assert target.read_bytes() == b"one"
    os.chmod(target, 0o600)
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_failure_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(target) as fh:
        fh.write(b"half of the new")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_explicit_mode_parents_and_symlink(tmp_path):
    target = tmp_path / "a" / "b" / "s.kv"
    atomic_write(target, b"x", mode=0o600, make_parents=True)
    assert os.stat(target).st_mode & 0o777 == 0o600
    link = tmp_path / "link"
    link.symlink_to(target)
    atomic_write(link, b"through the link")
    assert link.is_symlink() and target.read_bytes() == b"through the link"


def test_atomic_entry_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "own.kv"
    link.symlink_to(victim)
    with atomic_entry(link, mode=0o600) as fh:
        fh.write(b"new")
    assert victim.read_bytes() == b"keep"
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert os.stat(link).st_mode & 0o777 == 0o600
    with pytest.raises(RuntimeError), atomic_entry(link, mode=0o600) as fh:
        fh.write(b"half")
        raise RuntimeError("disk full")
    assert link.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.kv", "victim"]


def test_atomic_entry_at_replaces_an_entry_of_a_long_name_without_following_a_link(tmp_path):
    import os

    from ds4agent.fsutil import atomic_entry_at, open_dir_beneath

    name = "é" * 127 + "x"  # 255 bytes: the longest name a filesystem takes
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / name).symlink_to(victim)
    fd = open_dir_beneath(str(tmp_path))
    try:
        with atomic_entry_at(fd, name, mode=0o640) as f:
            f.write(b"new")
    finally:
        os.close(fd)
    assert (tmp_path / name).read_bytes() == b"new" and not (tmp_path / name).is_symlink()
    assert victim.read_text() == "keep" and oct(os.stat(tmp_path / name).st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "victim"])


def test_open_dir_beneath_refuses_a_link_on_the_way(tmp_path):
    import pytest

    from ds4agent.fsutil import PathChanged, open_dir_beneath

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(PathChanged) as err:
        open_dir_beneath(str(tmp_path / "link" / "deeper"), create=True)
    assert err.value.component == str(tmp_path / "link") and not (tmp_path / "real" / "deeper").exists()
