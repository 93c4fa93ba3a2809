"""The training script of bench_agent_overhead: a tiny MLP on CPU, one intra-op thread, a fixed number of steps;
each step (forward, backward, optimizer step, ``sdk.report_step``) is timed by the script itself, and so is the
``report_step`` call alone (wall and CPU time), and the step's CPU time on the training thread (``time.thread_time``: what other
processes' load moves far less than the wall time), and the time the thread waited, runnable, for a core
(``/proc/thread-self/schedstat``'s run-queue wait, where Linux has it): the lists are written as JSON
(``{"steps": [...], "report": [...], "report_cpu": [...], "cpu": [...], "wait": [...]}``) to the path given. Outside Teto ``report_step`` does nothing, so the same
script, unchanged, is the run without the agent.

Usage: python bench/_tiny_train.py STEPS OUT.json [WIDTH]
"""

import json
import os
import sys
import time

import torch

from teto import sdk


def _schedstat() -> int | None:
    """A descriptor on this thread's scheduler statistics (on-CPU ns, run-queue wait ns, slices), or None."""
    try:
        return os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None


def waited(fd: int | None) -> float:
    """Seconds this thread has waited, runnable, for a core (0.0 where the kernel does not say)."""
    if fd is None:
        return 0.0
    return int(os.pread(fd, 128, 0).split()[1]) / 1e9


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, width), torch.randn(64, width)
    times, report, report_cpu, cpu, wait = [], [], [], [], []
    sched = _schedstat()
    for step in range(1, steps + 1):
        w0 = waited(sched)
        c0, t0 = time.thread_time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        c1, t1 = time.thread_time(), time.perf_counter()
        sdk.report_step(step, total_steps=steps, loss=value)
        t2 = time.perf_counter()
        report_cpu.append(time.thread_time() - c1)
        times.append(t2 - t0)
        report.append(t2 - t1)
        cpu.append(time.thread_time() - c0)
        wait.append(waited(sched) - w0)
    with open(out, "w") as f:
        json.dump({"steps": times, "report": report, "report_cpu": report_cpu, "cpu": cpu, "wait": wait}, f)


if __name__ == "__main__":
    main()
