"""The health service: executor liveness and job signals (``no_signal``, ``stuck``) derived from heartbeats."""
