-- The queue's tables: jobs (lifecycle, lease, placement), their event history, commands already answered,
-- and the executors as their heartbeats describe them. Views *_public are the read interface of the gateway.

CREATE TABLE jobs (
    id text PRIMARY KEY,
    name text NOT NULL,
    owner text NOT NULL,
    state text NOT NULL,
    spec jsonb NOT NULL,
    attempts jsonb NOT NULL,
    attempt_number int NOT NULL DEFAULT 0,
    lease_epoch int NOT NULL DEFAULT 0,
    executor_id text,
    workers text[] NOT NULL DEFAULT '{}',
    lease_expires_at timestamptz,
    last_step bigint,
    total_steps bigint,
    step_seconds double precision,
    step_samples bigint NOT NULL DEFAULT 0,
    last_checkpoint jsonb,
    reason text,
    error text,
    stop_requested text,
    ceiling_history jsonb NOT NULL DEFAULT '[]'::jsonb,
    event_seq int NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX jobs_queued ON jobs (created_at, id) WHERE state = 'queued';
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_state ON jobs (state, created_at);

CREATE TABLE job_events (
    job_id text NOT NULL REFERENCES jobs (id),
    seq int NOT NULL,
    event text NOT NULL,
    state text NOT NULL,
    previous_state text,
    reason text,
    epoch int,
    executor_id text,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    time timestamptz NOT NULL,
    msg_id text NOT NULL,
    PRIMARY KEY (job_id, seq)
);

-- One row per command id: a redelivered command is answered with the stored outcome and acts only once.
CREATE TABLE processed_commands (
    command_id text PRIMARY KEY,
    kind text NOT NULL,
    job_id text,
    outcome jsonb,
    processed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE executors (
    executor_id text PRIMARY KEY,
    node_id text NOT NULL,
    group_name text NOT NULL,
    gpus int NOT NULL,
    accepting boolean NOT NULL,
    job_id text,
    epoch int,
    phase text,
    sent_at timestamptz NOT NULL,
    last_seen timestamptz NOT NULL
);

CREATE VIEW jobs_public AS
SELECT id, name, owner, state, spec, attempts, attempt_number, executor_id, lease_epoch, lease_expires_at,
       last_step, total_steps, step_seconds, last_checkpoint, reason, error, ceiling_history, created_at, updated_at
FROM jobs;

CREATE VIEW job_events_public AS
SELECT job_id, seq, event, state, previous_state, reason, epoch, executor_id, detail, time
FROM job_events;
