-- Executors as their heartbeats describe them, jobs as their events and heartbeats describe them, and the
-- signal the evaluator last derived for each. The *_public views are the gateway's read interface.

CREATE TABLE executors (
    executor_id text PRIMARY KEY,
    node_id text,
    group_name text,
    gpus jsonb NOT NULL DEFAULT '[]'::jsonb,
    accepting boolean NOT NULL DEFAULT false,
    phase text,
    step bigint,
    job_id text,
    epoch int,
    registered_at timestamptz,
    last_heartbeat timestamptz,
    -- last time the step, the phase or the job changed: a checkpoint pause restarts the stuck clock
    step_changed_at timestamptz,
    heartbeat_interval_seconds double precision,
    progress_interval_seconds double precision,
    signal text,
    signal_since timestamptz,
    thresholds jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    job_id text PRIMARY KEY,
    state text,                       -- from job events; NULL until the first one arrives
    event_seq int NOT NULL DEFAULT 0, -- last job event applied (events can be redelivered)
    epoch int NOT NULL DEFAULT 0,     -- current lease epoch; heartbeats with an older one are ignored
    executor_id text,
    -- last heartbeat about this job at the current epoch; a lease grant counts as first contact
    last_contact_at timestamptz,
    phase text,
    step bigint,
    step_changed_at timestamptz,
    progress_interval_seconds double precision,
    signal text,
    signal_since timestamptz,
    thresholds jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_to_evaluate ON jobs (job_id)
    WHERE state IS NULL OR state NOT IN ('succeeded', 'failed', 'cancelled') OR signal IS NOT NULL;

CREATE VIEW executors_public AS
SELECT executor_id, node_id, group_name, gpus, accepting, phase, step, job_id, epoch, last_heartbeat,
       signal, signal_since,
       thresholds || jsonb_build_object(
           'seconds_since_heartbeat', extract(epoch FROM now() - last_heartbeat)::double precision,
           'seconds_since_step_change', extract(epoch FROM now() - step_changed_at)::double precision,
           'heartbeat_interval_seconds', heartbeat_interval_seconds,
           'progress_interval_seconds', progress_interval_seconds) AS detail
FROM executors;

CREATE VIEW job_signals_public AS
SELECT job_id, executor_id, signal, signal_since,
       thresholds || jsonb_build_object(
           'seconds_since_heartbeat', extract(epoch FROM now() - last_contact_at)::double precision,
           'seconds_since_step_change', extract(epoch FROM now() - step_changed_at)::double precision,
           'phase', phase, 'step', step, 'epoch', epoch) AS detail
FROM jobs;
