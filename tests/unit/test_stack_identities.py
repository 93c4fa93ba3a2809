"""``teto up`` keeps its executors' identities in the data directory (teto/stack/identities.py), so a restart
re-attaches the same nodes instead of leaving dead ones behind and growing the fleet (issue 26, item 1)."""

from __future__ import annotations

import json
import stat
from itertools import count
from pathlib import Path

import pytest

from teto.stack.identities import Identities
from teto.stack.provisioner import executor_parts, replace_nodes

pytestmark = pytest.mark.unit


def maker(prefix: str = "local"):
    n = count(1)
    return lambda: f"{prefix}-{next(n)}"


def test_a_second_run_starts_each_part_under_the_id_it_had(tmp_path: Path):
    first, new = Identities(tmp_path), maker()
    ids = {name: first.take(name, new) for name in ("executor-1", "executor-2")}
    assert ids == {"executor-1": "local-1", "executor-2": "local-2"}
    again = Identities(tmp_path)
    assert {name: again.take(name, maker("other")) for name in ids} == ids
    assert stat.S_IMODE((tmp_path / "executors.json").stat().st_mode) == 0o600


def test_a_crash_restart_within_a_run_takes_a_new_id_and_the_next_run_keeps_the_latest(tmp_path: Path):
    ids = Identities(tmp_path)
    new = maker()
    assert ids.take("executor-1", new) == "local-1"
    assert ids.take("executor-1", new) == "local-2"  # the predecessor's lease expires on its own
    assert Identities(tmp_path).take("executor-1", maker("x")) == "local-2"


def test_a_replaced_part_never_comes_back_and_its_replacement_does(tmp_path: Path):
    ids = Identities(tmp_path)
    for name in ("executor-1", "executor-2"):
        ids.take(name, maker(name))
    ids.take("executor-r1", maker("r"))
    ids.forget("executor-1")
    later = Identities(tmp_path)
    assert executor_parts(2, later) == ["executor-2", "executor-r1"]
    assert executor_parts(3, later) == ["executor-2", "executor-3", "executor-r1"]


def test_a_fresh_data_directory_starts_the_asked_executors(tmp_path: Path):
    assert executor_parts(2, Identities(tmp_path)) == ["executor-1", "executor-2"]


def test_an_unreadable_identities_file_is_refused_with_what_to_do(tmp_path: Path):
    (tmp_path / "executors.json").write_text("{not json")
    with pytest.raises(ValueError, match="move it away"):
        Identities(tmp_path)


def test_ids_that_are_no_executor_id_are_dropped(tmp_path: Path):
    (tmp_path / "executors.json").write_text(json.dumps({"executor-1": "ok-1", "executor-2": "bad id; rm -rf",
                                                         "executor-3": 7}))
    ids = Identities(tmp_path)
    assert ids.take("executor-1", maker()) == "ok-1" and ids.take("executor-2", maker()) == "local-1"


def test_replacing_a_node_forgets_its_part_and_names_the_replacement_after_every_earlier_one(tmp_path: Path):
    from teto.stack.supervisor import Part

    class Sup:
        def __init__(self) -> None:
            self.parts = {"executor-1": Part("executor-1", ["x"], {}, executor_id="local-1")}
            self.stopping = False

        def stop(self, names):
            self.stopping = True

    ids = Identities(tmp_path)
    ids.take("executor-1", lambda: "local-1")
    ids.take("executor-r1", lambda: "r-1")
    ids.forget("executor-r1")  # replaced in an earlier run: its name is not reused
    (tmp_path / "provision").mkdir()
    (tmp_path / "provision" / "a.json").write_text(json.dumps({"node_id": "n1", "group": "g",
                                                               "executor_id": "local-1"}))
    added = []
    assert replace_nodes(Sup(), tmp_path, lambda name, group: added.append(name), ids) == ["executor-r2"]
    assert ids.replaced("executor-1") and executor_parts(1, Identities(tmp_path)) == []
