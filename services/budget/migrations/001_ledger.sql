-- The GPU-second ledger (append-only), each job's ceiling history, and the per-job account whose total is
-- maintained in the same transaction as every ledger insert. budget.jobs_public is the gateway's view.

CREATE TABLE ledger (
    id bigserial PRIMARY KEY,
    job_id text NOT NULL,
    epoch int NOT NULL,
    executor_id text NOT NULL,
    seq int NOT NULL,
    devices int NOT NULL,
    wall_seconds double precision NOT NULL,
    gpu_seconds double precision NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, epoch, executor_id, seq)  -- a redelivered sample is counted once
);

CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'budget.ledger is append-only: % refused', TG_OP;
END $$;
CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

CREATE TABLE jobs (
    job_id text PRIMARY KEY,
    owner text,
    state text,
    event_seq int NOT NULL DEFAULT 0,
    epoch int NOT NULL DEFAULT 0,
    ceiling_seconds double precision,       -- NULL until the submission is known
    consumed_seconds double precision NOT NULL DEFAULT 0,
    exhausted_for_ceiling double precision,
    overshoot_seconds double precision NOT NULL DEFAULT 0,
    devices int,
    checkpoint_every_steps int,
    estimated_step_seconds double precision,
    last_step bigint,
    mean_step_seconds double precision,
    measured_steps bigint NOT NULL DEFAULT 0,
    next_checkpoint_eta_seconds double precision,
    step_reported_at timestamptz,
    warning jsonb,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ceilings (
    job_id text NOT NULL,
    event_seq int NOT NULL,   -- the job event that set it: a redelivered event adds nothing
    ceiling_seconds double precision NOT NULL,
    actor text,
    reason text NOT NULL,
    consumed_seconds double precision,
    set_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, event_seq)
);

CREATE VIEW jobs_public AS
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
                          'measured_at', j.step_reported_at) AS checkpoint
FROM jobs j;
