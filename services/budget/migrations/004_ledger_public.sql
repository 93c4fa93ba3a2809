-- The ledger's charges as the gateway's usage report reads them (GET /v1/usage): each charged stretch with its
-- GPU-seconds and when it ended (the executor's clock; the time it was recorded for samples without one).
CREATE VIEW ledger_public AS
SELECT job_id, gpu_seconds, coalesce(ended_at, recorded_at) AS at FROM ledger;
