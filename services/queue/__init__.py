"""The queue service: the single writer of job lifecycle, leases and placement.

It consumes commands (submit, cancel, requeue), heartbeats, progress and budget events, places queued jobs on
free executors with an epoch-fenced lease, expires silent leases, and publishes job events through its outbox.
"""
