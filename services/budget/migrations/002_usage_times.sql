-- Usage records now carry the stretch of time they cover (the executor's clock), for operators reading the
-- ledger; NULL for samples that came in heartbeats before usage had its own subject.
ALTER TABLE ledger ADD COLUMN started_at timestamptz, ADD COLUMN ended_at timestamptz;
