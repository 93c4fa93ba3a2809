-- The ledger's index on (job_id, epoch) is the leading part of its unique key (job_id, epoch, executor_id, seq),
-- whose index serves every read that named it (a job's rows, a run's rows); each appended row paid for both.
DROP INDEX IF EXISTS ledger_job_epoch;
