-- The audit log: append-only by the database itself, hash-chained by the service.
-- A trigger refuses UPDATE, DELETE and TRUNCATE for everyone (a superuser must disable it first, which
-- breaks the chain visibly); the service writes through a role that holds INSERT and SELECT only.

CREATE TABLE log (
    seq bigserial PRIMARY KEY,
    command_id text NOT NULL,
    actor text,
    time timestamptz NOT NULL,          -- when the message says it was made (issued_at for a command)
    recorded_at timestamptz NOT NULL,   -- when the audit service recorded it
    subject text NOT NULL,
    kind text,
    job_id text,
    payload jsonb NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('received', 'accepted', 'refused', 'rejected')),
    reason text,
    prev_hash text NOT NULL,
    hash text NOT NULL,
    UNIQUE (command_id, outcome)  -- a redelivered message is stored once
);
CREATE INDEX log_actor ON log (actor, seq);
CREATE INDEX log_job ON log (job_id, seq);
CREATE INDEX log_kind ON log (kind, seq);
CREATE INDEX log_time ON log (time);

CREATE FUNCTION log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit.log is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER log_no_update_delete BEFORE UPDATE OR DELETE ON log
    FOR EACH ROW EXECUTE FUNCTION log_append_only();
CREATE TRIGGER log_no_truncate BEFORE TRUNCATE ON log
    FOR EACH STATEMENT EXECUTE FUNCTION log_append_only();

REVOKE ALL ON log FROM PUBLIC;

-- The writer role: <database>_audit_writer, INSERT and SELECT on the log only. Roles are cluster-wide, so
-- the database name keeps installations (and test databases) sharing a cluster apart. Created only where
-- the migrating user may create roles; otherwise an administrator creates it (see docs/operations.md).
DO $$
DECLARE
    writer text := current_database() || '_audit_writer';
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = writer) THEN
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', writer);
        EXCEPTION WHEN insufficient_privilege OR duplicate_object THEN
            RAISE NOTICE 'audit writer role % not created: %', writer, SQLERRM;
        END;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = writer) THEN
        EXECUTE format('GRANT USAGE ON SCHEMA audit TO %I', writer);
        EXECUTE format('GRANT SELECT, INSERT ON audit.log TO %I', writer);
        EXECUTE format('GRANT USAGE ON SEQUENCE audit.log_seq_seq TO %I', writer);
        -- The migrating user must be able to SET ROLE to it to write through it.
        IF NOT pg_has_role(current_user, writer, 'MEMBER') THEN
            EXECUTE format('GRANT %I TO %I', writer, current_user);
        END IF;
    END IF;
END $$;

-- An outcome stored before its command (they come on different streams) names no actor: the view takes it
-- from the command as received. The stored (hashed) row is never changed for it.
CREATE VIEW log_public AS
SELECT l.seq, l.command_id,
       COALESCE(l.actor, (SELECT r.actor FROM log r WHERE r.command_id = l.command_id AND r.outcome = 'received'))
           AS actor,
       l.time, l.recorded_at, l.subject, l.kind, l.job_id, l.payload, l.outcome, l.reason, l.prev_hash, l.hash
FROM log l;
