-- The trace context a job was submitted under (W3C traceparent/tracestate): its grants, which happen later in a
-- placement pass of their own, continue the submit's trace (libs/runtime/tracing.py). Absent when not traced.
CREATE TABLE job_traces (
    job_id text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    traceparent text NOT NULL CHECK (length(traceparent) <= 256),
    tracestate text CHECK (length(tracestate) <= 512)
);
