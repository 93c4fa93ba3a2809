"""Tenancy: organisations, projects and cohorts; quotas, fair share, budget reservations, preemption of
borrowed capacity, waiting reasons and usage reports. Pure rules only (no broker, no database, no clock reads);
the queue's edges feed them snapshots."""
