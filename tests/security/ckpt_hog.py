"""A ``command`` job that tries to hold its next attempt's executor (issue 26 item 3), as one was seen doing.

Attempt 1 writes a sparse ``step-00000005.pt`` of ``argv[1]`` bytes (no block written: it costs no disk) with a
sidecar claiming that size and a made-up digest, optionally reports it to the agent over ``TETO_REPORT_FD`` as a
10-byte checkpoint (a lie), and exits 3, so the job is placed again and the next attempt's start must verify the
file. Any later attempt exits 0 at once. Runs as the job's own uid with nothing but the standard library.
"""

import json
import os
import sys

size, report = int(sys.argv[1]), sys.argv[2] == "report"
if int(os.environ.get("TETO_ATTEMPT", "1")) > 1:
    sys.exit(0)
directory = os.environ["TETO_CHECKPOINT_DIR"]
os.makedirs(directory, exist_ok=True)
path = os.path.join(directory, "step-00000005.pt")
with open(path, "wb") as f:
    f.truncate(size)
with open(os.path.join(directory, "step-00000005.json"), "w") as f:
    json.dump({"step": 5, "sha256": "0" * 64, "bytes": size, "format": "bytes"}, f)
if report:
    os.write(int(os.environ["TETO_REPORT_FD"]),
             json.dumps({"type": "checkpoint", "step": 5, "path": path, "bytes": 10}).encode() + b"\n")
sys.exit(3)
