"""Who holds a file lock, read from ``/proc/locks``: the parser takes any text, and a real holder of
another uid is named with its pid and uid."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from flashinfer_sm120.safety.fs import proclocks
from helpers.probing import lock_held_as, reachable_dir


def test_the_lines_on_one_file_give_their_holders():
    dev = os.makedev(0xFE, 0)
    text = ("1: FLOCK  ADVISORY  WRITE 9174 fe:00:2146629 0 EOF\n"
            "1: -> FLOCK  ADVISORY  WRITE 9180 fe:00:2146629 0 EOF\n"  # a waiter, not a holder
            "2: FLOCK  ADVISORY  READ 9078 fe:00:2146630 0 EOF\n"  # another inode
            "3: FLOCK  ADVISORY  READ 0 fe:00:2146629 0 EOF\n"  # a holder in an unseen PID namespace
            "4: POSIX  ADVISORY  READ 77 fe:00:2146629 0 EOF\n")
    assert proclocks.parse_proc_locks(text, dev, 2146629) == [9174, 77]
    assert proclocks.parse_proc_locks(text, os.makedev(8, 1), 2146629) == []


@given(st.text(max_size=400), st.integers(0, 2**20), st.integers(0, 2**40))
def test_any_text_gives_only_positive_pids_and_never_raises(text, dev, ino):
    pids = proclocks.parse_proc_locks(text, dev, ino)
    assert all(isinstance(p, int) and 0 < p < 1 << 32 for p in pids)


def test_a_lock_another_uid_holds_through_a_read_only_open_is_named():
    """A module lock another uid flocks (it is readable by all) is named; ``build`` never waits on it without end
    (P6, P8)."""
    with reachable_dir() as d:
        path = d / "sampling.lock"
        path.write_text("")
        path.chmod(0o644)
        assert proclocks.holders(path) == []
        with lock_held_as(4321, path) as proc:
            found = proclocks.holders(path)
            assert found == [proclocks.Holder(proc.pid, 4321)], found
        assert proclocks.holders(path) == []
        assert proclocks.holders(d / "absent.lock") == []
