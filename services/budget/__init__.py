"""The budget service: the append-only GPU-second ledger per job, ceilings, and the events they cause."""
