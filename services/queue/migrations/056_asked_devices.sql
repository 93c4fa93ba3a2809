-- What a job asks for, in devices (workers x GPUs per worker, at least 1), as a column the database keeps from the
-- spec, and carried in the index placement's candidates are read from (services/queue/tenancy_edge.candidates):
-- each pass reads up to its size of queued jobs per organisation (4,000 rows with 20 organisations), and reading
-- every one from the table to take two numbers out of its spec was most of that statement (14 ms of a pass at
-- 10,000 queued); from the index alone it is 5 ms. Adding the column rewrites the jobs table once, holding it
-- locked meanwhile, and rebuilds its indexes (0.35 s for 100,000 jobs and this one index on the build machine).
ALTER TABLE jobs ADD COLUMN asked_devices int GENERATED ALWAYS AS (
    GREATEST(1, COALESCE((spec->>'workers')::int, 1) * GREATEST(1, COALESCE((spec->>'gpus_per_worker')::int, 0)))
) STORED;
DROP INDEX jobs_queued_org;
CREATE INDEX jobs_queued_org ON jobs (org, priority DESC, created_at, id) INCLUDE (asked_devices)
    WHERE state = 'queued';
