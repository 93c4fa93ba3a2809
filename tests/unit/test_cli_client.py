"""The operator CLI: where it finds the gateway and token, the spec it builds, the tables it prints, and that
a refusal prints the server's reason and exits non-zero. HTTP goes to a mock transport, not a server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest

from teto import cli_client, cli_common, cli_format, cli_http
from teto.cli_client import build_spec
from teto.cli_common import CliError, table
from teto.cli_format import format_job
from teto.cli_http import resolve_target

pytestmark = pytest.mark.unit

JOB = {"id": "j1", "name": "demo", "owner": "alice", "state": "running", "last_step": 60, "total_steps": 300,
       "executor_id": "e1", "lease_epoch": 2, "attempts": {"training_error": 1}, "reason": None, "error": None,
       "spec": {"gpu_ceiling_seconds": 3600.0},
       "signal": {"signal": "stuck", "signal_since": "2026-01-01T00:00:00Z"},
       "budget": {"ceiling_seconds": 3600.0, "consumed_seconds": 12.5, "remaining_seconds": 3587.5},
       "checkpoint": {"every_steps": 50, "last_step": 50, "next_step": 100, "next_eta_seconds": 20.0},
       "events": [{"seq": 1, "event": "submitted", "state": "queued", "time": "t0"}]}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="teto")
    cli_client.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


@pytest.fixture
def server(monkeypatch):
    """A fake gateway: records requests, answers from ``routes[(method, path)] = (status, body)``."""
    seen: list[httpx.Request] = []
    routes: dict[tuple[str, str], tuple[int, object]] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, body = routes.get((request.method, request.url.path), (404, {"reason": "no such route"}))
        return httpx.Response(status, json=body)

    monkeypatch.setattr(cli_http, "TRANSPORT", httpx.MockTransport(handle))
    monkeypatch.setenv("TETO_URL", "http://gw:1")
    monkeypatch.setenv("TETO_TOKEN", "secret")
    return routes, seen


def test_target_from_flags_then_env_then_stack_json(tmp_path):
    (tmp_path / "stack.json").write_text(json.dumps({"gateway_url": "http://stack:8080/", "admin_token": "adm"}))
    assert resolve_target("http://flag", "tok", tmp_path, {}) == ("http://flag", "tok")
    assert resolve_target(None, None, tmp_path, {"TETO_URL": "http://env", "TETO_TOKEN": "e"}) == ("http://env", "e")
    assert resolve_target(None, None, tmp_path, {}) == ("http://stack:8080", "adm")
    assert resolve_target(None, None, tmp_path, {"TETO_TOKEN": "e"}) == ("http://stack:8080", "e")
    with pytest.raises(CliError) as err:
        resolve_target(None, None, tmp_path / "nowhere", {})
    assert err.value.code == cli_common.EXIT_UNREACHABLE and "teto up" in str(err.value)


def test_spec_from_flags_file_and_command_argv(tmp_path):
    assert build_spec(parse("submit")) == {"workload": {"kind": "finetune"}}
    assert build_spec(parse("submit", "--memory-mb", "2048", "--pids", "256", "--disk-mb", "100"))["limits"] == {
        "memory_mb": 2048, "pids": 256, "disk_mb": 100}
    spec = build_spec(parse("submit", "--name", "n", "--steps", "40", "--ceiling", "90", "--checkpoint-every", "10",
                            "--checkpoints-kept", "0", "--workers", "2"))
    assert spec == {"name": "n", "workload": {"kind": "finetune", "params": {"steps": 40}},
                    "gpu_ceiling_seconds": 90.0, "checkpoint_every_steps": 10, "checkpoints_kept": 0, "workers": 2}
    spec = build_spec(parse("submit", "--env", "A=1", "--", "python", "train.py", "--lr", "3"))
    assert spec["workload"] == {"kind": "command", "command": ["python", "train.py", "--lr", "3"], "env": {"A": "1"}}
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"name": "from-file", "max_attempts": 5, "workload": {"kind": "finetune"}}))
    assert build_spec(parse("submit", "--file", str(f), "--name", "flag")) == {
        "name": "flag", "max_attempts": 5, "workload": {"kind": "finetune"}}
    with pytest.raises(CliError):
        build_spec(parse("submit", "--steps", "3", "--", "python", "x.py"))


def test_table_aligns_columns_and_reaches_into_nested_fields():
    out = table([JOB, {**JOB, "id": "j22", "signal": None}], cli_format.JOB_COLUMNS)
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "OWNER", "STATE", "STEP", "OF", "EXECUTOR", "SIGNAL", "GPU-S", "CEILING"]
    assert lines[1].split() == ["j1", "demo", "alice", "running", "60", "300", "e1", "stuck", "12.5", "3600"]
    assert lines[2].split()[7] == "-"
    assert lines[1].index("demo") == lines[2].index("demo")


def test_job_detail_shows_progress_checkpoint_signal_budget_and_events():
    out = format_job(JOB)
    for text in ("state     running", "step 60 of 300", "training_error=1", "next at 100 in 20 s",
                 "the executor's default kept on disk", "signal    stuck", "12.5 of 3600 GPU-s", "submitted"):
        assert text in out
    assert "the newest 5 kept on disk" in format_job({**JOB, "spec": {**JOB["spec"], "checkpoints_kept": 5}})
    assert "every one kept on disk" in format_job({**JOB, "spec": {**JOB["spec"], "checkpoints_kept": 0}})


def test_submit_posts_the_spec_and_prints_the_job(server, capsys):
    routes, seen = server
    routes[("POST", "/v1/jobs")] = (201, JOB)
    args = parse("submit", "--steps", "40")
    assert args.func(args) == 0
    assert json.loads(seen[0].content) == {"workload": {"kind": "finetune", "params": {"steps": 40}}}
    assert seen[0].headers["authorization"] == "Bearer secret"
    assert "step 60 of 300" in capsys.readouterr().out


def test_json_output_is_the_servers_body(server, capsys):
    routes, _ = server
    routes[("GET", "/v1/jobs")] = (200, [JOB])
    args = parse("jobs", "--state", "running", "--json")
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out) == [JOB]


def test_a_refusal_prints_the_reason_and_numbers_and_exits_non_zero(server, capsys):
    routes, seen = server
    routes[("POST", "/v1/jobs/j1/requeue")] = (422, {"error": "refused", "reason": "ceiling below consumed + 60",
                                                     "detail": {"consumed_seconds": 100, "minimum_seconds": 160}})
    args = parse("requeue", "j1", "--gpu-ceiling", "120")
    assert args.func(args) == cli_common.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "ceiling below consumed + 60" in err and "minimum_seconds=160" in err
    assert json.loads(seen[0].content) == {"gpu_ceiling_seconds": 120.0}


def test_forbidden_names_the_permission(server, capsys):
    routes, _ = server
    routes[("POST", "/v1/jobs/j1/cancel")] = (403, {"error": "forbidden", "reason": "no", "permission": "x:y"})
    args = parse("cancel", "j1")
    assert args.func(args) == cli_common.EXIT_REFUSED
    assert "needs x:y" in capsys.readouterr().err


def test_pending_outcome_is_reported_as_sent(server, capsys):
    routes, _ = server
    routes[("POST", "/v1/jobs/j1/cancel")] = (202, {"command_id": "c1", "status": "pending", "job_id": "j1"})
    args = parse("cancel", "j1")
    assert args.func(args) == 0
    assert "pending" in capsys.readouterr().out


def test_unreachable_gateway_exits_with_its_own_code(monkeypatch, capsys):
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    monkeypatch.setattr(cli_http, "TRANSPORT", httpx.MockTransport(refuse))
    args = parse("executors", "--url", "http://gw:1", "--token", "t")
    assert args.func(args) == cli_common.EXIT_UNREACHABLE
    assert "cannot reach the gateway" in capsys.readouterr().err


def test_tokens_create_writes_the_file_and_prints_the_secret_once(tmp_path, capsys):
    args = parse("tokens", "create", "--actor", "ops", "--role", "operator", "--data-dir", str(tmp_path), "--json")
    assert args.func(args) == 0
    made = json.loads(capsys.readouterr().out)
    stored = json.loads((tmp_path / "tokens.json").read_text())["tokens"]
    assert [t["id"] for t in stored] == [made["id"]] and made["secret"] not in json.dumps(stored)
    args = parse("tokens", "revoke", made["id"], "--data-dir", str(tmp_path))
    assert args.func(args) == 0
    assert json.loads((tmp_path / "tokens.json").read_text())["tokens"][0]["revoked"] is True


def test_contracts_export_writes_schemas_and_events_md(tmp_path):
    args = parse("contracts", "export", "--out", str(tmp_path / "s"), "--events-md", str(tmp_path / "e.md"))
    assert args.func(args) == 0
    assert (tmp_path / "s" / "index.json").exists() and Path(tmp_path / "e.md").read_text().startswith("<!--")


def test_audit_lists_entries_and_verify_exits_non_zero_naming_the_bad_row(server, capsys):
    routes, seen = server
    routes[("GET", "/v1/audit")] = (200, {"entries": [{"seq": 1, "actor": "a", "kind": "submit",
                                                       "outcome": "refused", "reason": "no"}], "next_after_seq": 1})
    args = parse("audit", "--actor", "a", "--limit", "1")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "refused" in out and "--after-seq 1" in out
    assert dict(seen[0].url.params) == {"actor": "a", "limit": "1"}
    routes[("GET", "/v1/audit/verify")] = (200, {"ok": False, "checked": 7, "first_bad_seq": 7, "reason": "hash"})
    args = parse("audit", "verify")
    assert args.func(args) == cli_common.EXIT_REFUSED
    assert "BROKEN at seq 7" in capsys.readouterr().out
    routes[("GET", "/v1/audit/verify")] = (200, {"ok": True, "checked": 7, "first_bad_seq": None, "reason": None})
    assert args.func(args) == 0


def test_audit_verify_says_what_the_audit_service_checked_besides_the_chain(server, capsys):
    routes, _ = server
    verdict = {"ok": False, "checked": 9, "first_bad_seq": 9, "reason": "truncated: ...", "keyed": True,
               "macs_checked": 8, "pre_key_rows": 0, "anchors_checked": 1, "first_bad_anchor": 2,
               "last_anchor_seq": 6, "last_anchor_time": "2026-12-01T07:00:00Z", "head_seq": 8}
    routes[("GET", "/v1/audit/verify")] = (200, verdict)
    args = parse("audit", "verify")
    assert args.func(args) == cli_common.EXIT_REFUSED
    out = capsys.readouterr().out
    assert "8 macs checked, 0 pre-key rows; 1 anchors checked, last anchor seq 6" in out
    assert "first bad anchor: #2" in out
    routes[("GET", "/v1/audit/verify")] = (200, {**verdict, "ok": True, "keyed": False, "first_bad_anchor": None})
    assert args.func(args) == 0 and "NO KEY: macs not checked" in capsys.readouterr().out


def test_job_detail_shows_overshoot_the_ceiling_history_and_the_warning():
    budget = {"ceiling_seconds": 133.5, "consumed_seconds": 13.5, "remaining_seconds": 120.0,
              "overshoot_seconds": 1.5,
              "ceiling_history": [{"ceiling_seconds": 12.0, "actor": "alice", "at": "t0", "consumed_seconds": 0.0},
                                  {"ceiling_seconds": 133.5, "actor": "ops", "at": "t1", "consumed_seconds": 13.5}],
              "warning": {"expected_seconds": 40.0, "ceiling_seconds": 30.0, "reason": "first checkpoint after 40"}}
    out = format_job({**JOB, "budget": budget})
    for text in ("13.5 of 133.5 GPU-s, 120 left, overshoot 1.5", "12 GPU-s set by alice at t0",
                 "133.5 GPU-s set by ops at t1 (13.5 consumed then)", "warning   first checkpoint after 40"):
        assert text in out, out


def test_audit_time_range_goes_to_the_gateway(server):
    routes, seen = server
    routes[("GET", "/v1/audit")] = (200, {"entries": [], "next_after_seq": None})
    args = parse("audit", "--kind", "requeue", "--since", "2026-01-01T00:00:00Z", "--until", "2026-01-02T00:00:00Z")
    assert args.func(args) == 0
    assert dict(seen[0].url.params) == {"kind": "requeue", "since": "2026-01-01T00:00:00Z",
                                        "until": "2026-01-02T00:00:00Z"}


def test_check_nodes_and_check_status_talk_to_the_gateway(monkeypatch, tmp_path, capsys):
    """teto check --group, teto check-status and teto nodes: the requests made and the tables printed."""
    import httpx

    from teto import cli_http

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content))
        if request.url.path == "/v1/health-checks":
            return httpx.Response(200, json={"command_id": "c", "run_id": "r1", "nodes": ["n1", "n2"],
                                             "cordoned": ["n2"], "skipped": {}})
        if request.url.path == "/v1/health-checks/r1":
            return httpx.Response(200, json={"run_id": "r1", "kind": "on_demand", "group_name": "g", "state": "running",
                                             "nodes": [{"node_id": "n1", "status": "running", "tests": [
                                                 {"test": "membw", "status": "passed", "figures": {"copy_gbps": 9.5}}]}]})
        return httpx.Response(200, json=[{"node_id": "n1", "group_name": "g", "state": "ready", "schedulable": True}])

    monkeypatch.setattr(cli_http, "TRANSPORT", httpx.MockTransport(handler))
    from teto.cli import main

    base = ["--url", "http://gw", "--token", "t"]
    assert main(["check", "--group", "g", *base]) == 0
    assert "cordoned until their job ends: n2" in capsys.readouterr().out
    assert main(["check-status", "r1", *base]) == 0
    out = capsys.readouterr().out
    assert "n1: running" in out and "copy_gbps=9.5" in out
    assert main(["nodes", *base]) == 0
    assert "ready" in capsys.readouterr().out
    assert seen[0][0] == "POST" and b'"group":"g"' in seen[0][2].replace(b" ", b"")
    assert main(["check", "--group", "g", "--node", "n1", *base]) == 2  # one target only


def test_dead_letters_are_listed_as_a_table_and_replayed_by_sequence(server, capsys):
    routes, seen = server
    letter = {"seq": 7, "time": "t", "service": "budget", "cause": "permanent", "subject": "teto.progress.j1",
              "deliveries": 1, "reason": "bigint out of range"}
    routes[("GET", "/v1/dead-letters")] = (200, {"dead_letters": [letter], "next_after_seq": None,
                                                 "counts": {"budget": 1}})
    routes[("POST", "/v1/dead-letters/7/replay")] = (200, {"seq": 7, "replayed": True, "subject": "teto.progress.j1"})
    args = parse("dead-letters", "--service", "budget")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "bigint out of range" in out and "permanent" in out and "teto.progress.j1" in out
    assert seen[-1].url.params["service"] == "budget"
    args = parse("dead-letters", "replay", "7")
    assert args.func(args) == 0
    assert "replayed on teto.progress.j1" in capsys.readouterr().out and seen[-1].method == "POST"


def test_secret_env_is_read_from_the_shell_not_the_command_line(monkeypatch):
    import argparse

    from teto.cli_client import build_spec
    from teto.cli_common import CliError

    args = argparse.Namespace(file=None, argv=["--", "train"], env=[("A", "1")], secret_env=["HF_TOKEN"],
                              steps=None, name=None, ceiling=None, checkpoint_every=None, workers=None, gpus=None,
                              max_attempts=None)
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert build_spec(args)["workload"]["env"] == {"A": "1", "HF_TOKEN": {"secret": "hf_x"}}
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(CliError, match="set HF_TOKEN"):
        build_spec(args)


def test_ca_file_from_the_flag_or_the_environment(tmp_path):
    import ssl

    from teto.cli_common import CliError, tls_verify
    from teto.tls import make_tls

    files = make_tls(tmp_path, ["localhost"])
    assert tls_verify(None, {}) is True
    assert isinstance(tls_verify(files.ca, {}), ssl.SSLContext)
    assert isinstance(tls_verify(None, {"TETO_CA_FILE": str(files.ca)}), ssl.SSLContext)
    with pytest.raises(CliError, match="no CA certificate"):
        tls_verify(tmp_path / "missing.pem", {})


def _paged(monkeypatch, total: int):
    """The fake gateway serves ``total`` jobs in pages of the asked limit, with X-Next-Cursor like the gateway."""
    rows = [{**JOB, "id": f"j{i}"} for i in range(total)]
    calls: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        calls.append(params)
        start = int(params.get("cursor", "0"))
        end = start + int(params["limit"])
        headers = {"X-Next-Cursor": str(end)} if end < total else {}
        return httpx.Response(200, json=rows[start:end], headers=headers)

    monkeypatch.setattr(cli_http, "TRANSPORT", httpx.MockTransport(handle))
    return rows, calls


def test_jobs_all_follows_every_cursor_and_each_job_comes_once(server, monkeypatch, capsys):
    rows, calls = _paged(monkeypatch, 2345)
    args = parse("jobs", "--all", "--json", "--state", "queued")
    assert args.func(args) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)] == [r["id"] for r in rows]
    assert [c.get("cursor") for c in calls] == [None, "1000", "2000"] and all(c["state"] == "queued" for c in calls)


def test_jobs_limit_stops_at_the_limit_and_says_how_to_go_on(server, monkeypatch, capsys):
    _, calls = _paged(monkeypatch, 2345)
    args = parse("jobs", "--limit", "1500")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.count("\nj") == 1500 and "--cursor 1500" in out
    assert [c["limit"] for c in calls] == ["1000", "500"]  # the last page asks only for what is still wanted
    args = parse("jobs", "--cursor", "2300")
    assert args.func(args) == 0 and capsys.readouterr().out.count("\nj") == 45


def test_job_shows_the_provisional_time_and_the_interruption_cost_apart_from_the_ledger():
    job = {**JOB, "budget": {**JOB["budget"], "provisional_seconds": 4.0, "consumed_live_seconds": 16.5,
                             "provisional_since": "2026-01-01T00:00:30Z",
                             "ceiling_history": [{"ceiling_seconds": 3600.0, "previous_ceiling_seconds": 60.0,
                                                  "actor": "ops", "at": "t1", "consumed_seconds": 50.0}]},
           "interruption_cost": {"kind": "at_risk", "steps": 10, "gpu_seconds": 9.5, "checkpoint_step": 50}}
    text = format_job(job)
    assert "16.5 GPU-s = 12.5 in the ledger + 4 provisional" in text
    assert "at risk   10 steps and 9.5 GPU-s since the last checkpoint (step 50)" in text
    one = format_job({**job, "interruption_cost": {**job["interruption_cost"], "steps": 1}})
    assert "at risk   1 step and 9.5 GPU-s" in one
    assert "3600 GPU-s set by ops at t1 (50 consumed then; from 60)" in text
    lost = format_job({**job, "interruption_cost": {**job["interruption_cost"], "kind": "lost"}})
    assert "lost      10 steps" in lost
    assert "provisional" not in format_job(JOB) and "since the last checkpoint" not in format_job(JOB)


def _events(*spec: tuple) -> list[dict]:
    return [{"seq": seq, "event": event, "state": "running", "time": f"t{seq}", "epoch": epoch, "reason": None,
             "executor_id": "ex-1", "detail": {"step": step} if step is not None else {}}
            for seq, event, epoch, step in spec]


def test_teto_job_folds_a_run_of_checkpoints_into_one_line_with_its_steps():
    events = _events((101, "started", 1, None), *((101 + i, "checkpointed", 1, 2 * i) for i in range(1, 151)),
                     (252, "interrupted", 1, None), (253, "requeued", 2, None), (254, "checkpointed", 2, 302))
    out = format_job({**JOB, "events": events})
    lines = out.splitlines()
    folded = next(line for line in lines if "checkpointed x150" in line)
    assert folded.split()[:2] == ["102-251", "t102"] and "steps 2-300, until t251" in folded
    single = next(line for line in lines if line.startswith("254 "))
    assert "checkpointed " in single and "step 302" in single and " x" not in single
    order = [next(i for i, line in enumerate(lines) if line.startswith(seq)) for seq in ("101", "102-251", "252",
                                                                                        "253", "254")]
    assert order == sorted(order)  # oldest first, as before
    assert "(earlier events: GET /v1/jobs/j1/events)" in out  # seq 101 is not the first event


def test_teto_job_prints_the_last_rows_and_says_when_earlier_ones_exist():
    out = format_job({**JOB, "events": _events(*((s, "signal", 1, None) for s in range(1, 31)))})
    shown = [line.split()[0] for line in out.splitlines() if line[:1].isdigit()]
    assert shown == [str(s) for s in range(11, 31)] and "(earlier events:" in out
    assert "(earlier events:" not in format_job(JOB)


def test_teto_job_asks_for_enough_events_to_fold_and_json_keeps_the_apis_default(server, capsys):
    routes, seen = server
    routes[("GET", "/v1/jobs/j1")] = (200, JOB)
    args = parse("job", "j1")
    assert args.func(args) == 0
    assert seen[-1].url.params["events"] == str(cli_format.EVENTS_READ)
    args = parse("job", "j1", "--json")
    assert args.func(args) == 0
    assert "events" not in seen[-1].url.params


def test_submit_no_wait_asks_for_respond_async_and_points_at_the_commands_decision(server, capsys):
    routes, seen = server
    routes[("POST", "/v1/jobs")] = (202, {"command_id": "c9", "status": "pending", "job_id": "j9"})
    args = parse("submit", "--name", "later", "--no-wait")
    assert args.func(args) == 0
    assert seen[-1].headers["prefer"] == "respond-async"
    assert json.loads(seen[-1].content)["name"] == "later"  # the flag is not part of the spec
    assert "teto command c9" in capsys.readouterr().out
    args = parse("submit", "--name", "now")
    routes[("POST", "/v1/jobs")] = (201, JOB)
    assert args.func(args) == 0 and "prefer" not in seen[-1].headers


def test_command_prints_its_decision_with_the_reason(server, capsys):
    routes, seen = server
    routes[("GET", "/v1/commands/c9")] = (200, {
        "command_id": "c9", "kind": "requeue", "actor": "alice", "job_id": "j9", "status": "refused", "by": "queue",
        "reason": "new ceiling 100s is below consumed 100s + 60s", "detail": {"minimum_seconds": 160.0},
        "received_at": "t0", "decided_at": "t1"})
    args = parse("command", "c9")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "command c9 (requeue) by alice: refused by queue: new ceiling 100s" in out
    assert "job: j9" in out and "minimum_seconds=160.0" in out and "decided: t1" in out


def test_tokens_go_through_the_gateway_when_one_is_known(server, capsys):
    routes, seen = server
    routes[("POST", "/v1/tokens")] = (201, {"id": "t9", "actor": "ci", "role": "submitter", "secret": "teto_s"})
    routes[("POST", "/v1/me/tokens")] = (201, {"id": "t8", "actor": "me", "role": "viewer", "secret": "teto_m"})
    routes[("DELETE", "/v1/tokens/t9")] = (204, None)
    args = parse("tokens", "create", "--actor", "ci", "--role", "submitter", "--description", "nightly",
                 "--expires-in-days", "30", "--json")
    assert args.func(args) == 0 and json.loads(capsys.readouterr().out)["secret"] == "teto_s"
    assert json.loads(seen[-1].content) == {"actor": "ci", "role": "submitter", "description": "nightly",
                                            "expires_in_days": 30.0}
    args = parse("tokens", "create", "--role", "viewer", "--mine", "--json")
    assert args.func(args) == 0 and seen[-1].url.path == "/v1/me/tokens"
    args = parse("tokens", "revoke", "t9")
    assert args.func(args) == 0 and (seen[-1].method, seen[-1].url.path) == ("DELETE", "/v1/tokens/t9")


def test_the_login_session_is_used_for_its_own_gateway_only(tmp_path, monkeypatch):
    import stat
    import time

    from teto import cli_session

    creds = tmp_path / "c" / "credentials.json"
    cli_session.write_private(creds, {"gateway_url": "http://gw:1", "secret": "tetos_abc",
                                    "expires_at": time.time() + 3600})
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    args = argparse.Namespace(timeout=5, ca_file=None)
    assert cli_session.session_for("http://gw:1", creds, args) == "tetos_abc"
    assert cli_session.session_for("http://elsewhere:1", creds, args) is None  # never sent to another gateway
    assert resolve_target("http://gw:1", None, tmp_path, {}, login=lambda url: "tetos_abc") == ("http://gw:1",
                                                                                                 "tetos_abc")
    cli_session.write_private(creds, {"gateway_url": "http://gw:1", "secret": "tetos_abc", "expires_at": time.time()})
    with pytest.raises(CliError, match="teto login"):  # ended, and nothing to refresh it with
        cli_session.session_for("http://gw:1", creds, args)


@pytest.mark.parametrize(("left", "refresh"), [(3600, False), (301, False), (299, True), (0, True), (-10, True)])
def test_a_session_is_refreshed_when_it_has_less_than_five_minutes_left(left, refresh):
    from teto.cli_session import needs_refresh

    assert needs_refresh({"expires_at": 1000.0 + left}, 1000.0) is refresh
