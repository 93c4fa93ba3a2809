-- A node whose agent is a Slurm pilot: the Slurm job it runs in (its hostname is then the node's Slurm name),
-- for the Slurm provisioner (drain, resume, reboot, replace) and for `teto slurm status`.
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS slurm_job_id text;

CREATE OR REPLACE VIEW nodes_public AS
SELECT n.node_id, n.group_name, n.executor_id, n.state,
       n.state = 'ready' AND NOT n.cordoned AND n.held IS NULL AS schedulable,
       CASE WHEN n.state = 'ready' AND n.held IS NOT NULL THEN n.held
            WHEN n.state = 'ready' AND n.cordoned THEN 'cordoned for check run ' || n.run_id
            WHEN n.state = 'ready' THEN NULL ELSE n.reason END AS reason,
       n.reboots, n.run_id, n.cordoned, n.hostname, n.gpus, n.since, n.last_check_run_id, n.last_check_at,
       n.last_check_outcome, n.figures, e.job_id, e.last_heartbeat, n.held IS NOT NULL AS held,
       (SELECT g.alert FROM group_guards g WHERE g.group_name = n.group_name) AS alert,
       n.slurm_job_id
FROM nodes n LEFT JOIN executors e ON e.executor_id = n.executor_id;
