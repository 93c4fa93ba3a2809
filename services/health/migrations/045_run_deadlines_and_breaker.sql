-- Check-run deadlines (a report that can never arrive fails the node instead of leaving it checking) and the
-- replacement circuit breaker per group (a budget per window and a systemic-failure alert that holds the group).
ALTER TABLE check_run_nodes ADD COLUMN deadline_at timestamptz;  -- the report is due before this
ALTER TABLE nodes ADD COLUMN held text;  -- held out of scheduling by its group's systemic-failure alert
ALTER TABLE nodes ADD COLUMN joined_at timestamptz;  -- its first registration (a reboot keeps it)

CREATE TABLE group_guards (
    group_name text PRIMARY KEY,
    replacements jsonb NOT NULL DEFAULT '[]'::jsonb,  -- [{node_id, at, tests}] inside the window
    alert jsonb,                                      -- {reason, since, tests, nodes} while it stands
    cleared_at timestamptz,
    cleared_by text,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE VIEW nodes_public AS
SELECT n.node_id, n.group_name, n.executor_id, n.state,
       n.state = 'ready' AND NOT n.cordoned AND n.held IS NULL AS schedulable,
       CASE WHEN n.state = 'ready' AND n.held IS NOT NULL THEN n.held
            WHEN n.state = 'ready' AND n.cordoned THEN 'cordoned for check run ' || n.run_id
            WHEN n.state = 'ready' THEN NULL ELSE n.reason END AS reason,
       n.reboots, n.run_id, n.cordoned, n.hostname, n.gpus, n.since, n.last_check_run_id, n.last_check_at,
       n.last_check_outcome, n.figures, e.job_id, e.last_heartbeat, n.held IS NOT NULL AS held,
       (SELECT g.alert FROM group_guards g WHERE g.group_name = n.group_name) AS alert
FROM nodes n LEFT JOIN executors e ON e.executor_id = n.executor_id;

CREATE OR REPLACE VIEW node_groups_public AS
SELECT s.group_name, count(*) AS nodes,
       count(*) FILTER (WHERE state = 'ready' AND NOT cordoned AND held IS NULL) AS schedulable,
       jsonb_object_agg(state, n) AS states, max(last_check_at) AS last_check_at,
       (SELECT g.alert FROM group_guards g WHERE g.group_name = s.group_name) AS alert
FROM (SELECT group_name, state, cordoned, held, last_check_at, count(*) OVER (PARTITION BY group_name, state) AS n
      FROM nodes) s
GROUP BY s.group_name;
