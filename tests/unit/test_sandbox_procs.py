"""Which processes a uid still owns (agents/executor/uids.py): the scan behind taking and sweeping a run's
uid, read from /proc status files (a fake /proc here, and the real one)."""

from __future__ import annotations

import os

from agents.executor.uids import live_processes, state_and_uid, uids_with_processes

STATUS = ("Name:\t{name}\nUmask:\t0022\nState:\t{state}\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\nPPid:\t1\n"
          "TracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def _proc(tmp_path, rows):
    for pid, state, uid in rows:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "status").write_text(STATUS.format(name="x", state=state, pid=pid, uid=uid))
    return tmp_path


def test_running_and_sleeping_processes_count_and_zombies_do_not(tmp_path):
    proc = _proc(tmp_path, [(10, "R (running)", 0), (11, "S (sleeping)", 70001), (12, "Z (zombie)", 70002),
                            (13, "X (dead)", 70003), (14, "D (disk sleep)", 70004), (15, "T (stopped)", 70005)])
    assert sorted(live_processes(proc)) == [(10, 0), (11, 70001), (14, 70004), (15, 70005)]
    assert uids_with_processes(proc) == {0, 70001, 70004, 70005}


def test_entries_that_are_not_processes_or_vanish_are_skipped(tmp_path):
    proc = _proc(tmp_path, [(20, "S (sleeping)", 5)])
    (tmp_path / "self").mkdir()  # not a pid
    (tmp_path / "21").mkdir()  # exited between the listing and the read: no status
    (tmp_path / "22").mkdir()
    (tmp_path / "22" / "status").write_text("Name:\tbroken\n")  # neither State nor Uid
    assert live_processes(proc) == [(20, 5)]


def test_the_real_uid_is_the_first_of_the_four():
    text = STATUS.format(name="p", state="S (sleeping)", pid=1, uid=7).replace("Uid:\t7\t7", "Uid:\t7\t0")
    assert state_and_uid(text.encode()) == (b"S", 7)


def test_a_status_without_state_before_uid_or_with_a_bad_uid_is_none():
    assert state_and_uid(b"Name:\tx\nUid:\t1\t1\t1\t1\n") is None
    assert state_and_uid(b"State:\tS (sleeping)\nUid:\tnope\n") is None
    assert state_and_uid(b"State:\tS (sleeping)\nUid:\n") is None
    assert state_and_uid(b"") is None


def test_the_real_proc_lists_this_process_with_its_uid():
    assert (os.getpid(), os.getuid()) in live_processes()


def test_the_lines_are_found_wherever_they_stand_and_a_name_cannot_pose_as_one():
    assert state_and_uid(b"State:\tR (running)\nUid:\t5\t5\t5\t5") == (b"R", 5)  # first line, no final newline
    assert state_and_uid(b"Name:\tx\nUid:\t1\t1\t1\t1\nState:\tS (sleeping)\n") is None  # Uid before State
    # A process named "Uid:\t0" (its name is escaped in status: never a line of its own) is not uid 0.
    fake = b"Name:\tState:\tR Uid:\t0\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t70001\t70001\t70001\t70001\n"
    assert state_and_uid(fake) == (b"S", 70001)
    assert state_and_uid(b"Name:\tx\nState:\t\nUid:\t9\t9\t9\t9\n") == (b"?", 9)
