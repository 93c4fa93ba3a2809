-- Heartbeats ignored because they named a job at an older lease epoch than the job's (a zombie executor after
-- a partition heals), counted per executor. (Numbered 010 to leave 002-009 to other changes.)

CREATE TABLE stale_heartbeats (
    executor_id text PRIMARY KEY,
    count bigint NOT NULL,
    last_job_id text NOT NULL,
    last_epoch int,
    current_epoch int NOT NULL,
    first_at timestamptz NOT NULL,
    last_at timestamptz NOT NULL
);

CREATE VIEW stale_heartbeats_public AS
SELECT executor_id, count, last_job_id, last_epoch, current_epoch, first_at, last_at FROM stale_heartbeats;
