"""Built-in workloads run by the executor as child processes (``python -m agents.executor.workloads.<name>``)."""
