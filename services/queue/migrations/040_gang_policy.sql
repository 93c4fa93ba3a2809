-- Gang scheduling: each job's gang (its workers with their own leases, readiness and ends), its rendezvous, ready
-- deadline and back-off; executors' addresses (rank 0's host is the rendezvous host); the admins' gang policy
-- (one row; none means the defaults of libs.contracts.policies.GangPolicy). Views: the gang on the job,
-- with each worker's rank and node, and the policy.

ALTER TABLE jobs
    ADD COLUMN gang jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN rendezvous text,
    ADD COLUMN ready_deadline timestamptz,
    ADD COLUMN admitted_at timestamptz,
    ADD COLUMN backoff_count int NOT NULL DEFAULT 0,
    ADD COLUMN next_admission_at timestamptz,
    ADD COLUMN on_node_failure text NOT NULL DEFAULT 'requeue_gang';
CREATE INDEX jobs_admitting ON jobs (ready_deadline) WHERE state = 'admitting';
CREATE INDEX jobs_backoff ON jobs (next_admission_at) WHERE state = 'backoff';

ALTER TABLE executors ADD COLUMN address text;

CREATE TABLE gang_policy (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),  -- a single row
    ready_timeout_seconds double precision NOT NULL CHECK (ready_timeout_seconds > 0),
    backoff_base_seconds double precision NOT NULL CHECK (backoff_base_seconds > 0),
    backoff_max_seconds double precision NOT NULL CHECK (backoff_max_seconds >= backoff_base_seconds),
    backoff_limit int CHECK (backoff_limit >= 0),  -- null: unlimited
    sequential_admission boolean NOT NULL,
    node_failure_strategy text NOT NULL CHECK (node_failure_strategy IN ('requeue_gang', 'fail_job')),
    updated_by text NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE VIEW gang_policy_public AS
SELECT ready_timeout_seconds, backoff_base_seconds, backoff_max_seconds, backoff_limit, sequential_admission,
       node_failure_strategy, updated_by, updated_at
FROM gang_policy;

CREATE OR REPLACE VIEW jobs_public AS
SELECT id, name, owner, state, spec, attempts, attempt_number, executor_id, lease_epoch, lease_expires_at,
       last_step, total_steps, step_seconds, last_checkpoint, reason, error, ceiling_history, created_at, updated_at,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                    'rank', g.ord - 1, 'executor_id', g.w->>'executor_id', 'node_id', e.node_id,
                    'ready', g.w->>'ready_at' IS NOT NULL, 'ready_at', g.w->'ready_at', 'ended', g.w->'ended',
                    'lease_expires_at', g.w->'lease_expires_at') ORDER BY g.ord), '[]'::jsonb)
        FROM jsonb_array_elements(j.gang) WITH ORDINALITY AS g(w, ord)
        LEFT JOIN executors e ON e.executor_id = g.w->>'executor_id') AS gang,
       rendezvous, ready_deadline, backoff_count, next_admission_at
FROM jobs j;
