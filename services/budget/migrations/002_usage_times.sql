-- Usage records now carry the stretch of time they cover (the executor's clock), for operators reading the
-- ledger (NULL for samples that came in heartbeats before usage had its own subject), and whether the record
-- closed its run (cut at the process's exit), so a reconciliation can tell a complete run from one with a gap.
ALTER TABLE ledger ADD COLUMN started_at timestamptz, ADD COLUMN ended_at timestamptz,
    ADD COLUMN last boolean NOT NULL DEFAULT false;
