-- Each job's accepted step reports (current lease epoch, from the executor holding it: what the lifecycle
-- applied), for the loss curve and the step-time plot. Executors throttle step reports to one per progress
-- interval, so a job stores about (run time / progress interval) rows; the gateway downsamples what it shows.
-- A redelivered report is stored once (its job, epoch and step). Numbered 052 to leave room around it.
CREATE TABLE job_steps (
    job_id text NOT NULL REFERENCES jobs (id),
    epoch int NOT NULL,
    step bigint NOT NULL,
    loss double precision,
    step_seconds double precision,
    metrics jsonb NOT NULL DEFAULT '{}'::jsonb,
    time timestamptz NOT NULL,          -- when the executor sent it
    PRIMARY KEY (job_id, epoch, step)
);

CREATE VIEW job_steps_public AS
SELECT job_id, epoch, step, loss, step_seconds, metrics, time FROM job_steps;
