"""Pure rules of the health service: no broker, no database, no clock reads (``now`` is an argument)."""
