-- The agent start each row is about (NodeRegistered.boot_id, in its heartbeats and in health's node events): a node
-- judged ready for an earlier start of its executor takes no work from the executor's new start until the health
-- service has checked it again (an agent restarted by `teto up` is re-checked; placement no longer races that).
ALTER TABLE executors ADD COLUMN boot_id text;
ALTER TABLE nodes ADD COLUMN boot_id text;
