-- The gateway owns no tables: API tokens live in the tokens file (only their hashes). The schema exists so the
-- gateway's outbox and migration bookkeeping have a home like every other service's.
SELECT 1;
