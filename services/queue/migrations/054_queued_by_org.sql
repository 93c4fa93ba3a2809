-- The candidates of a placement pass (services/queue/tenancy_edge.candidates) are read per organisation, each in
-- its own admission order (higher priority first, then older), at most the pass's size each: with 10,000 queued
-- jobs, reading every queued row each pass was a sequential scan of the jobs table.
CREATE INDEX jobs_queued_org ON jobs (org, priority DESC, created_at, id) WHERE state = 'queued';
