-- The queue's view of each executor's run (from its heartbeats, and cleared by its end report: executors.free_ended),
-- for the gateway's executor and node lists: a heartbeat naming a run the executor has since reported ended is
-- shown as over, not as still training until the next heartbeat (services/gateway/domain/views.run_ended).
CREATE VIEW executors_public AS SELECT executor_id, job_id, epoch, phase, sent_at FROM executors;
