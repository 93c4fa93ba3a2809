"""The queue's pure domain: the job lifecycle and placement. No broker, no database, no clock reads."""
