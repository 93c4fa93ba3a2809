"""Runtime plumbing every service shares: settings, NATS and stream set-up, PostgreSQL pools and migrations,
the transactional outbox relay, singleton loops and the clock. No domain logic lives here."""
