-- Tenancy (issue 14): organisations (quotas per node group, cohort, weight, budget per period), their projects,
-- cohorts (preemption policy). Every job belongs to a project of an organisation; jobs and tokens from before
-- belong to the 'default' organisation, unmetered (its spec has no quotas), so nothing that ran before changes.
-- A queued job carries the reason it is not admitted yet (``waiting``), written by each placement pass.

CREATE TABLE orgs (
    name text PRIMARY KEY,
    spec jsonb NOT NULL,  -- libs.contracts.tenancy.OrgSpec
    updated_by text NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE TABLE projects (
    org text NOT NULL REFERENCES orgs (name),
    name text NOT NULL,
    spec jsonb NOT NULL,  -- libs.contracts.tenancy.ProjectSpec
    updated_by text NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (org, name)
);
CREATE TABLE cohorts (
    name text PRIMARY KEY,
    preemption text NOT NULL CHECK (preemption IN ('never', 'reclaim_borrowed', 'by_priority')),
    updated_by text NOT NULL,
    updated_at timestamptz NOT NULL
);
INSERT INTO orgs (name, spec, updated_by, updated_at) VALUES ('default', '{}'::jsonb, 'migration', now());
INSERT INTO projects (org, name, spec, updated_by, updated_at)
VALUES ('default', 'default', '{}'::jsonb, 'migration', now());

ALTER TABLE jobs
    ADD COLUMN org text NOT NULL DEFAULT 'default',
    ADD COLUMN project text NOT NULL DEFAULT 'default',
    ADD COLUMN priority int NOT NULL DEFAULT 0,
    ADD COLUMN node_group text,       -- the group of its current run's nodes (quota is counted there)
    ADD COLUMN devices int NOT NULL DEFAULT 0,  -- what its current run holds against the quota
    ADD COLUMN waiting jsonb;          -- queued: {"code", "reason", "numbers", "at"}
CREATE INDEX jobs_org_state ON jobs (org, state);

CREATE VIEW orgs_public AS SELECT name, spec, updated_by, updated_at FROM orgs;
CREATE VIEW projects_public AS SELECT org, name, spec, updated_by, updated_at FROM projects;
CREATE VIEW cohorts_public AS SELECT name, preemption, updated_by, updated_at FROM cohorts;

CREATE OR REPLACE VIEW jobs_public AS
SELECT id, name, owner, state, spec, attempts, attempt_number, executor_id, lease_epoch, lease_expires_at,
       last_step, total_steps, step_seconds, last_checkpoint, reason, error, ceiling_history, created_at, updated_at,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                    'rank', g.ord - 1, 'executor_id', g.w->>'executor_id', 'node_id', e.node_id,
                    'ready', g.w->>'ready_at' IS NOT NULL, 'ready_at', g.w->'ready_at', 'ended', g.w->'ended',
                    'lease_expires_at', g.w->'lease_expires_at') ORDER BY g.ord), '[]'::jsonb)
        FROM jsonb_array_elements(j.gang) WITH ORDINALITY AS g(w, ord)
        LEFT JOIN executors e ON e.executor_id = g.w->>'executor_id') AS gang,
       rendezvous, ready_deadline, backoff_count, next_admission_at,
       org, project, priority, node_group, devices, CASE WHEN state = 'queued' THEN waiting END AS waiting
FROM jobs j;
