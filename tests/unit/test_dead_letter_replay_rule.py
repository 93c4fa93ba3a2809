"""Which dead letters the gateway may replay (services/gateway/dead_letters.refusal): what it may publish on the
bus as itself (libs/runtime/natsauth.py: commands, and the refusals it decides), whole payloads only."""

from __future__ import annotations

import pytest

from libs.contracts.dead import DeadCause, dead_letter
from libs.contracts.subjects import Subjects
from services.gateway.dead_letters import refusal, view

pytestmark = pytest.mark.unit


def letter(subject: str, payload: bytes = b"{}"):
    return dead_letter(service="queue", consumer="c", cause=DeadCause.PERMANENT, reason="r", subject=subject,
                       payload=payload)


@pytest.mark.parametrize("prefix", ["teto", "site-a"])
def test_commands_and_edge_refusals_are_replayable_what_other_parts_publish_is_not(prefix):
    s = Subjects(prefix)
    for subject in (s.cmd("submit"), s.cmd("requeue"), s.outcome("submit", "c-1")):
        assert refusal(1, letter(subject), prefix) is None, subject
    for subject in (s.heartbeat("ex-1"), s.job_event("j1", "started"), s.dead("queue"), f"{prefix}.progress.j1",
                    f"{prefix}.usage.ex-1", f"{prefix}.agent.ex-1.run", "elsewhere.cmd.submit"):
        why = refusal(7, letter(subject), prefix)
        assert why and f"dead letter 7 came on {subject}" in why and "only the part that sent it" in why, subject


def test_a_cut_payload_is_never_replayable_and_the_view_says_why():
    cut = letter(Subjects().cmd("submit"), b"x" * 300_000)
    why = refusal(4, cut)
    assert why == "dead letter 4 kept only the first 262144 of 300000 bytes; it cannot be replayed"
    shown = view(4, cut)
    assert shown["replayable"] is False and shown["not_replayable"] == why and shown["truncated"]
    whole = view(5, letter(Subjects().cmd("cancel")))
    assert whole["replayable"] is True and whole["not_replayable"] is None
