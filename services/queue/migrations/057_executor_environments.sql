-- The Python environments each executor offers (issue 27: TETO_ENVIRONMENTS, in its heartbeats), so a submit that
-- names one no executor offers is refused (services/queue/domain/submits.environment_refusal).
ALTER TABLE executors ADD COLUMN environments text[] NOT NULL DEFAULT '{}';
