"""What a job's runs reported, as the job view shows it (issue 27): the latest step report with its loss and
learning rate, the accepted checkpoints with their kind, size and files; and how the panel writes sizes and
measured figures per locale."""

from __future__ import annotations

import math

import pytest

from services.gateway.domain.reported import checkpoints, latest_report, learning_rate
from services.gateway.panel import fmt

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("metrics", "lr"), [
    ({"learning_rate": 2e-4, "lr": 1.0}, 2e-4), ({"lr": 0.1}, 0.1), ({"lr-AdamW": 3e-5, "grad_norm": 1.2}, 3e-5),
    ({"lr_head": 0.5, "lr-body": 0.25}, 0.25), ({"learning_rate": math.inf, "lr": 0.1}, 0.1),
    ({"learning_rate": True}, None), ({"grad_norm": 1.0}, None), ({}, None), (None, None),
], ids=["hf", "lr", "lightning", "first-by-name", "not-finite", "bool", "none", "empty", "missing"])
def test_the_learning_rate_is_found_among_the_metrics(metrics, lr):
    assert learning_rate(metrics) == lr


def test_the_latest_report_carries_loss_and_learning_rate():
    row = {"epoch": 2, "step": 120, "loss": 0.5, "step_seconds": 0.25, "metrics": {"learning_rate": 1e-4},
           "time": "t"}
    assert latest_report(row) == {"step": 120, "epoch": 2, "loss": 0.5, "learning_rate": 1e-4, "step_seconds": 0.25,
                                  "metrics": {"learning_rate": 1e-4}, "time": "t"}
    assert latest_report(None) is None
    assert latest_report({"step": 1, "loss": None, "metrics": None})["loss"] is None


def test_checkpoints_newest_first_with_kind_size_and_files():
    events = [
        {"event": "checkpointed", "epoch": 1, "time": "t1", "detail": {"step": 20, "bytes": 9, "path": "/a.pt"}},
        {"event": "step", "epoch": 1},
        {"event": "checkpointed", "epoch": 2, "time": "t3", "detail": {"step": 10, "kind": "directory",
                                                                      "bytes": 4096, "files": 5, "path": "/c-10"}},
        {"event": "checkpointed", "epoch": 1, "time": "t2", "detail": {"step": 30, "kind": "bogus", "bytes": 1}},
    ]
    assert checkpoints(events) == [
        {"step": 10, "epoch": 2, "kind": "directory", "bytes": 4096, "files": 5, "path": "/c-10", "time": "t3"},
        {"step": 30, "epoch": 1, "kind": "file", "bytes": 1, "files": 1, "path": None, "time": "t2"},
        {"step": 20, "epoch": 1, "kind": "file", "bytes": 9, "files": 1, "path": "/a.pt", "time": "t1"}]
    assert checkpoints([]) == []


@pytest.mark.parametrize(("value", "en", "pt"), [
    (0, "0 B", "0 B"), (512, "512 B", "512 B"), (1536, "1.5 KiB", "1,5 KiB"), (3 * 2**19, "1.5 MiB", "1,5 MiB"),
    (5 * 2**30, "5 GiB", "5 GiB"), (2**41, "2 TiB", "2 TiB"), (None, "—", "—"), (math.nan, "—", "—"),
])
def test_sizes_read_in_binary_units_per_locale(value, en, pt):
    assert (fmt.size(value, "en"), fmt.size(value, "pt-BR")) == (en, pt)


@pytest.mark.parametrize(("value", "en", "pt"), [
    (0.693147, "0.6931", "0,6931"), (2e-4, "0.0002", "0,0002"), (5e-6, "5e-06", "5e-06"), (12.5, "12.5", "12,5"),
    (None, "—", "—"), (math.inf, "—", "—"),
])
def test_measured_figures_keep_four_significant_digits(value, en, pt):
    assert (fmt.significant(value, "en"), fmt.significant(value, "pt-BR")) == (en, pt)


def test_teto_job_says_what_the_runs_reported():
    from teto.cli_format import live_lines

    job = {"id": "j1", "reported": {"step": 30, "loss": 0.25, "learning_rate": 0.0002},
           "checkpoints": [{"step": 30, "kind": "directory", "bytes": 4147, "files": 2},
                           {"step": 20, "kind": "file", "bytes": 9, "files": 1}]}
    assert live_lines(job) == ["reported  step 30: loss 0.25, learning rate 0.0002",
                               "last ckpt step 30: a directory of 4147 bytes in 2 files"]
    assert live_lines({"checkpoints": [{"step": 5, "kind": "file", "bytes": 9}]}) == [
        "last ckpt step 5: a file of 9 bytes"]
    assert live_lines({"reported": None, "checkpoints": []}) == []
