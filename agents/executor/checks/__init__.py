"""The deep health-check suite an executor agent runs on its node (DESIGN.md 7).

``suite`` holds the tests (matmul, membw, memtest, nvml from ``nvml``, connectivity, allreduce), each taking a
``Spec`` and returning a ``Result`` (``spec``); they run in a child process
(``python -m agents.executor.checks``) so the agent keeps heartbeating and a crash or hang in CUDA cannot take
the agent down. ``runner`` starts that process and turns its JSON lines into ``CheckReport`` messages;
``reach`` is the small TCP echo listener other nodes' connectivity tests dial; ``faults`` reads the test-only
switch ``TETO_TEST_FAULT``.
"""
