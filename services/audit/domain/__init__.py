"""Pure rules of the audit service: what a log entry holds, and the hash chain over entries."""
