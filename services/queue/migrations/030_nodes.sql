-- Nodes as the health service's node events describe them: placement gives work only to executors whose node
-- is schedulable (ready and not cordoned). The health service is the single writer of the facts; this is a copy.
CREATE TABLE nodes (
    node_id text PRIMARY KEY,
    executor_id text,
    group_name text,
    state text NOT NULL,
    schedulable boolean NOT NULL,
    reason text,
    seq int NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX nodes_schedulable ON nodes (executor_id) WHERE schedulable;
