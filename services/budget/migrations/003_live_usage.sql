-- What the gateway needs to show consumption between usage samples and the cost of an interruption:
-- when the job's current run started (the job event that moved it into running; a run's first sample comes a
-- heartbeat later), and, in the public view, the current run's last sample, whether that run's records are
-- closed (its process exited), the devices charged and the database clock the figures are read at. The ledger's
-- rows are public too (budget.usage_public) for the time charged after a checkpoint. Numbered 003; no rule lives
-- here, only facts: the arithmetic is the gateway's pure code (services/gateway/domain/live.py).
ALTER TABLE jobs ADD COLUMN running_since timestamptz;
CREATE INDEX ledger_job_epoch ON ledger (job_id, epoch);

CREATE OR REPLACE VIEW jobs_public AS
SELECT j.job_id, j.ceiling_seconds, j.consumed_seconds,
       GREATEST(j.ceiling_seconds - j.consumed_seconds, 0) AS remaining_seconds,
       j.overshoot_seconds, j.warning,
       COALESCE((SELECT jsonb_agg(jsonb_build_object('ceiling_seconds', c.ceiling_seconds, 'actor', c.actor,
                                                     'reason', c.reason, 'consumed_seconds', c.consumed_seconds,
                                                     'at', c.set_at) ORDER BY c.event_seq)
                 FROM ceilings c WHERE c.job_id = j.job_id), '[]'::jsonb) AS ceiling_history,
       jsonb_build_object('every_steps', j.checkpoint_every_steps, 'last_step', j.last_step,
                          'mean_step_seconds', j.mean_step_seconds,
                          'next_eta_seconds', j.next_checkpoint_eta_seconds,
                          'measured_at', j.step_reported_at) AS checkpoint,
       j.epoch, j.devices, j.running_since,
       r.last_sample_at, COALESCE(r.closed, false) AS run_closed, now() AS read_at
FROM jobs j
LEFT JOIN LATERAL (SELECT max(l.recorded_at) AS last_sample_at, bool_or(l.last) AS closed FROM ledger l
                   WHERE l.job_id = j.job_id AND l.epoch = j.epoch) r ON true;

CREATE VIEW usage_public AS
SELECT job_id, epoch, executor_id, seq, devices, wall_seconds, gpu_seconds, started_at, ended_at, recorded_at, last
FROM ledger;
