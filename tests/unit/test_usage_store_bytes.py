"""The usage report's checkpoint_bytes: what each organisation's jobs hold in the checkpoint store now, from each
job's latest stored checkpoint (which says it after its retention)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.gateway.domain import usage

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _events(*held: int | None) -> list[dict]:
    out = [{"event": "submitted", "time": T0, "detail": None}]
    for i, h in enumerate(held):
        detail = {"step": 10 * (i + 1)} | ({} if h is None else {"stored_bytes": h, "state": "stored"})
        out.append({"event": "checkpointed", "time": T0 + timedelta(seconds=i + 1), "detail": detail})
    return out


def _job(job_id: str, org: str) -> dict:
    return {"id": job_id, "org": org, "project": "p", "owner": "ann", "state": "running", "attempts": {},
            "spec": {"checkpoint_every_steps": 10}, "last_step": 30}


def test_checkpoint_bytes_per_organisation():
    facts = [usage.job_facts(_job("a", "hospital"), _events(100, 250, 180)),  # retention brought it down to 180
             usage.job_facts(_job("b", "hospital"), _events(40)),
             usage.job_facts(_job("c", "agency"), _events(None, None)),  # the shared directory: nothing stored
             usage.job_facts(_job("d", "agency"), _events(7, None))]
    assert [f.checkpoint_bytes for f in facts] == [180, 40, 0, 7]
    result = usage.report([], facts, usage.GroupBy.ORG, T0, T0 + timedelta(days=30))
    assert {r.key: r.checkpoint_bytes for r in result.rows} == {"hospital": 220, "agency": 7}
    body = usage.as_json(result)
    assert {r["key"]: r["checkpoint_bytes"] for r in body["rows"]} == {"hospital": 220, "agency": 7}
    csv = usage.to_csv_rows(result)
    assert csv[0][-1] == "checkpoint_bytes" and {row[0]: row[-1] for row in csv[1:]} == {"hospital": "220",
                                                                                           "agency": "7"}
