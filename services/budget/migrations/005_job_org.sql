-- Each job's organisation (tenancy), from its submitted event, so the budget can answer what an organisation
-- consumed in a period (teto.rpc.budget.orgs). Jobs from before tenancy belong to 'default'.
ALTER TABLE jobs ADD COLUMN org text NOT NULL DEFAULT 'default';
CREATE INDEX jobs_org ON jobs (org);
