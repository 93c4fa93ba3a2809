"""Running Teto locally: embedded NATS and PostgreSQL, and `teto up` which starts every part."""
