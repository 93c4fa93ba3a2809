"""The executor agent: runs one training process at a time on its node, under a lease from the queue."""
