"""``teto.sdk``: the client a training script uses to report to its executor (``from teto import sdk``).

The implementation is ``agents/executor/sdk.py``, the child's side of the agent's report pipe; this module
only gives it the name user scripts import. Any python a job runs can import it: the agent puts the
installation it runs from on the child's ``PYTHONPATH``.
"""

from agents.executor.sdk import *  # noqa: F401, F403 - the SDK's public names, re-exported
from agents.executor.sdk import __all__  # noqa: F401
