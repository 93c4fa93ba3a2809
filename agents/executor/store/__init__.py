"""Checkpoint stores: where a job's checkpoints live when executors share no filesystem (docs/checkpoint-store.md).

``base`` (the interface and its errors), ``fs`` (a directory), ``s3`` (any S3-compatible endpoint), ``manifest``
(pure: keys, manifests, which checkpoint to restore, retention), ``files`` (the objects a checkpoint path is made
of), ``uploader`` (the agent's background uploads, manifest last) and ``restore`` (download and verify at resume).
"""
