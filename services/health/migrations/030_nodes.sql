-- The node lifecycle and deep-check runs. A node is keyed by its node id; its executor may change (a reboot
-- keeps it, a replacement is a new node). The *_public views are the gateway's read interface.

CREATE TABLE nodes (
    node_id text PRIMARY KEY,
    group_name text NOT NULL,
    executor_id text,
    state text NOT NULL,
    reason text,
    reboots int NOT NULL DEFAULT 0,
    run_id text,                          -- the check run the node is in (checking, or cordoned for)
    cordoned boolean NOT NULL DEFAULT false,
    needs_check boolean NOT NULL DEFAULT false,  -- joining: the check loop puts it in a run
    boot_id text,
    address text,                         -- reachability listener host:port
    collective_port int,
    hostname text,
    gpus jsonb NOT NULL DEFAULT '[]'::jsonb,
    figures jsonb NOT NULL DEFAULT '{}'::jsonb,  -- latest passing figures per test: the group's healthy set
    last_check_run_id text,
    last_check_at timestamptz,
    last_check_outcome text,
    event_seq int NOT NULL DEFAULT 0,
    since timestamptz,
    registered_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX nodes_group ON nodes (group_name, state);

CREATE TABLE check_runs (
    run_id text PRIMARY KEY,
    kind text NOT NULL,                   -- join, recovery, on_demand
    group_name text,
    requested_by text,
    tests text[] NOT NULL,
    force boolean NOT NULL DEFAULT false,
    state text NOT NULL DEFAULT 'running',  -- running, done
    created_at timestamptz NOT NULL,
    finished_at timestamptz
);

CREATE TABLE check_run_nodes (
    run_id text NOT NULL REFERENCES check_runs (run_id),
    node_id text NOT NULL,
    status text NOT NULL,                 -- waiting (busy, cordoned), pending, running, passed, failed
    wave int,                             -- nodes started together (they share the all-reduce)
    rank int,
    world_size int,
    rendezvous text,
    reason text,
    started_at timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (run_id, node_id)
);

CREATE TABLE check_results (
    run_id text NOT NULL,
    node_id text NOT NULL,
    test text NOT NULL,
    status text NOT NULL,                 -- pending, running, passed, failed, not_applicable
    attempt int NOT NULL DEFAULT 1,
    figures jsonb NOT NULL DEFAULT '{}'::jsonb,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    verdict jsonb NOT NULL DEFAULT '{}'::jsonb,
    error text,
    seconds double precision,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node_id, test)
);

CREATE TABLE processed_commands (
    command_id text PRIMARY KEY,
    kind text NOT NULL,
    outcome jsonb,
    processed_at timestamptz NOT NULL DEFAULT now()
);

CREATE VIEW nodes_public AS
SELECT n.node_id, n.group_name, n.executor_id, n.state, n.state = 'ready' AND NOT n.cordoned AS schedulable,
       CASE WHEN n.state = 'ready' AND n.cordoned THEN 'cordoned for check run ' || n.run_id
            WHEN n.state = 'ready' THEN NULL ELSE n.reason END AS reason,
       n.reboots, n.run_id, n.cordoned, n.hostname, n.gpus, n.since, n.last_check_run_id, n.last_check_at,
       n.last_check_outcome, n.figures, e.job_id, e.last_heartbeat
FROM nodes n LEFT JOIN executors e ON e.executor_id = n.executor_id;

CREATE VIEW node_groups_public AS
SELECT group_name, count(*) AS nodes,
       count(*) FILTER (WHERE state = 'ready' AND NOT cordoned) AS schedulable,
       jsonb_object_agg(state, n) AS states, max(last_check_at) AS last_check_at
FROM (SELECT group_name, state, cordoned, last_check_at, count(*) OVER (PARTITION BY group_name, state) AS n
      FROM nodes) s
GROUP BY group_name;

CREATE VIEW check_runs_public AS
SELECT r.run_id, r.kind, r.group_name, r.requested_by, r.tests, r.force, r.state, r.created_at, r.finished_at,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
            'node_id', rn.node_id, 'status', rn.status, 'reason', rn.reason, 'rank', rn.rank,
            'world_size', rn.world_size, 'started_at', rn.started_at, 'finished_at', rn.finished_at,
            'tests', COALESCE((SELECT jsonb_agg(jsonb_build_object(
                 'test', cr.test, 'status', cr.status, 'attempt', cr.attempt, 'figures', cr.figures,
                 'verdict', cr.verdict, 'error', cr.error, 'seconds', cr.seconds) ORDER BY cr.test)
              FROM check_results cr WHERE cr.run_id = rn.run_id AND cr.node_id = rn.node_id), '[]'::jsonb))
          ORDER BY rn.node_id)
         FROM check_run_nodes rn WHERE rn.run_id = r.run_id), '[]'::jsonb) AS nodes
FROM check_runs r;
