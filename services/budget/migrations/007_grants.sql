-- Each lease grant the budget has seen (from the queue's `leased` job events): who may charge a run of the job
-- under that epoch, on how many devices each worker, since when (services/budget/domain/grants.py). A usage
-- record outside a grant is refused on teto.rejected.budget, never charged.
CREATE TABLE grants (
    job_id text NOT NULL,
    epoch int NOT NULL,
    workers text[] NOT NULL,  -- empty: granted before the budget kept grants (holder unknown; bounds still apply)
    devices int NOT NULL,     -- per worker
    granted_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, epoch)
);

-- Runs under way when this table came: their grant is the job's current epoch since its run began (who holds it
-- was never kept), so their usage is still charged within the devices and the time since then.
INSERT INTO grants (job_id, epoch, workers, devices, granted_at)
SELECT job_id, epoch, '{}', GREATEST(COALESCE(devices, 1), 1), COALESCE(running_since, updated_at, now())
FROM jobs WHERE epoch > 0 AND (state IS NULL OR state NOT IN ('succeeded', 'failed', 'cancelled'));

-- Usage records that arrived before their grant (the job events and usage streams are read apart): judged again
-- when the job's epoch moves or it ends.
CREATE TABLE held_usage (
    job_id text NOT NULL,
    epoch int NOT NULL,
    executor_id text NOT NULL,
    seq int NOT NULL,
    devices int NOT NULL,
    wall_seconds double precision NOT NULL,
    started_at timestamptz,
    ended_at timestamptz,
    last boolean NOT NULL DEFAULT false,
    held_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, epoch, executor_id, seq)
);
