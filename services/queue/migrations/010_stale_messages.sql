-- Messages ignored because they came from an older lease epoch (a zombie executor after a partition, a report
-- that arrived after the lease expired), counted per executor. The count is the operator's evidence that
-- fencing worked; the messages themselves changed nothing. (Numbered 010 to leave 002-009 to other changes.)

CREATE TABLE stale_messages (
    executor_id text PRIMARY KEY,
    count bigint NOT NULL,
    last_job_id text NOT NULL,
    last_epoch int,
    last_reason text NOT NULL,
    first_at timestamptz NOT NULL,
    last_at timestamptz NOT NULL
);

CREATE VIEW stale_messages_public AS
SELECT executor_id, count, last_job_id, last_epoch, last_reason, first_at, last_at FROM stale_messages;
