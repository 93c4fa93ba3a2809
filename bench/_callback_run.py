"""One run of the HF LoRA example with its ``TetoCallback`` timed (bench/bench_callback.py): every hook of the
callback is wrapped to add the training thread's CPU time spent in it, and the sum over the run is written, with
the number of steps, to ``argv[1]``. The rest of ``argv`` goes to the example.
    python -m bench._callback_run OUT.json --max-steps 300 ..."""

from __future__ import annotations

import functools
import json
import runpy
import sys
import time
from pathlib import Path

from teto.integrations import transformers as integration

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_lora" / "train.py"
# The hooks every step runs (checkpoints are left out of the benchmark; the one-off hooks of a run's start and end
# are not a step's cost).
HOOKS = ("on_step_begin", "on_step_end", "on_log")
spent = {"seconds": 0.0, "steps": 0}


def _timed(hook):  # noqa: ANN001, ANN202 - any hook
    @functools.wraps(hook)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        t0 = time.thread_time()
        try:
            return hook(*args, **kwargs)
        finally:
            spent["seconds"] += time.thread_time() - t0
            if hook.__name__ == "on_step_end":
                spent["steps"] += 1
    return wrapper


class Timed(integration.TetoCallback):
    pass


for name in HOOKS:
    setattr(Timed, name, _timed(getattr(integration.TetoCallback, name)))
integration.TetoCallback = Timed  # what the example imports

if __name__ == "__main__":
    out = sys.argv[1]
    sys.argv = [str(EXAMPLE), *sys.argv[2:]]
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    Path(out).write_text(json.dumps(spent))
