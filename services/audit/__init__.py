"""The audit service: every command, outcome and refused message in an append-only, hash-chained log."""
