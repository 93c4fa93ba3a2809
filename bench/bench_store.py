"""The S3 checkpoint store against the raw client library on the same SeaweedFS server, in the same run:

- ``store_upload``: the agent's upload of a checkpoint (``store.uploader``: SHA-256 of every object, multipart
  upload, the manifest last) against boto3's ``upload_file`` of the same file with the same part size and
  concurrency; MB/s, target ratio >= 0.8.
- ``store_download``: the resume's ``store.restore`` (manifest, download, SHA-256 check, rename into place)
  against boto3's ``download_file``; MB/s, target ratio >= 0.8.
- ``store_stall``: a training loop's step time in its own process while the agent uploads, against the same loop
  with nothing uploading for as long before and after each upload (medians); the run is never paused for an
  upload, and the agent's upload threads run at nice 10 in the idle scheduling class and the server at nice
  10 as in ``teto up``, so what is left is
  sharing the machine; target ratio <= 1.1.
- ``store_download`` also says the CPU seconds of each side (this process, every thread): ours hashes every byte.

Rounds alternate the order (ours, raw / raw, ours); figures are medians. Run:
.venv/bin/python -m bench.bench_store [--quick] [--mb N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UPLOAD_TARGET, STALL_TARGET = 0.8, 1.1
JOB = "bench-job"
LOOP = r"""
import sys, time, torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
out = open(sys.argv[1], "w", buffering=1)
while True:
    t0 = time.perf_counter()
    for _ in range(20):
        a = torch.tanh(a @ a.T / 256)
    out.write(f"{time.monotonic()} {time.perf_counter() - t0}\n")
"""


# The training loop on one core of its own; the agent, the client and the server on all of them (pinning them to
# the rest of a 2-core machine put the download's SHA-256 on the same single core as the server: a measure of the
# machine, not of the agent).
TRAIN_CPUS = {sorted(os.sched_getaffinity(0))[0]}


def _pin(cpus: set[int]) -> None:
    os.sched_setaffinity(0, cpus)


def _server(root: Path):
    from teto.stack.seaweed import EmbeddedSeaweed, niced

    server = EmbeddedSeaweed(root / "seaweedfs").prepare()
    proc = subprocess.Popen(niced(server.argv()),  # as ``teto up`` starts it env=server.env(dict(os.environ)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    server.wait_ready(60, alive=lambda: proc.poll() is None)
    return server, proc


def measure(mb: int, rounds: int, root: Path) -> dict:
    from boto3.s3.transfer import TransferConfig

    from agents.executor import checkpoints
    from agents.executor.store import files
    from agents.executor.store.restore import restore
    from agents.executor.store.s3 import S3Config, S3Store
    from agents.executor.store.uploader import Upload, Uploader
    from libs.contracts.agents import AcceptedCheckpoint

    server, proc = _server(root)
    try:
        part, concurrency = 16 << 20, 4
        store = S3Store(S3Config(endpoint=server.endpoint, bucket=server.bucket, access_key_id=server.access_key_id,
                                 secret_access_key=server.secret_file.read_text().strip(), part_bytes=part,
                                 concurrency=concurrency))
        raw = server.client()
        transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=concurrency)
        local = root / "ckpt"
        block = os.urandom(1 << 20)
        ckpt = checkpoints.save(local, 1, lambda f: [f.write(block) for _ in range(mb)], fmt="bytes")
        size = ckpt.bytes / 1e6
        loop_log = root / "loop.txt"
        loop = subprocess.Popen([sys.executable, "-c", LOOP, str(loop_log)], preexec_fn=lambda: _pin(TRAIN_CPUS))
        while not loop_log.exists() or loop_log.stat().st_size < 100:  # the loop has imported torch and steps
            if loop.poll() is not None:
                raise RuntimeError("the training loop exited")
            time.sleep(0.1)
        up, raw_up, down, raw_down = [], [], [], []
        cpu_down, cpu_raw_down = [], []  # this process's CPU seconds (every thread) per download
        windows: list[tuple[str, float, float]] = []  # ("base" | "busy", start, end), monotonic
        took = 5.0  # the last upload's seconds: each baseline window is as long as the upload it surrounds
        try:
            for r in range(rounds):
                for side in ("ours", "raw") if r % 2 == 0 else ("raw", "ours"):
                    t0 = time.perf_counter()
                    if side == "raw":
                        raw.upload_file(str(ckpt.path), server.bucket, f"raw/{r}.pt", Config=transfer)
                        raw_up.append(size / (time.perf_counter() - t0))
                        continue
                    # The same loop with nothing uploading, as long as the upload, before and after it: the other
                    # load on the machine weighs on both sides alike.
                    idle = time.monotonic()
                    time.sleep(took)
                    start = time.monotonic()
                    windows.append(("base", idle, start))
                    t0 = time.perf_counter()
                    asyncio.run(_upload(store, local, Upload(JOB, r + 1, 1, ckpt.path.name, ckpt.sha256, ckpt.bytes,
                                                            "t"), Uploader))
                    took = time.perf_counter() - t0
                    up.append(size / took)
                    end = time.monotonic()
                    windows.append(("busy", start, end))
                    time.sleep(took)
                    windows.append(("base", end, time.monotonic()))
                for side in ("ours", "raw") if r % 2 == 0 else ("raw", "ours"):
                    dest = root / f"down-{side}"
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir()
                    t0, c0 = time.perf_counter(), time.process_time()
                    if side == "raw":
                        raw.download_file(server.bucket, f"raw/{r}.pt", str(dest / "x.pt"), Config=transfer)
                        raw_down.append(size / (time.perf_counter() - t0))
                        cpu_raw_down.append(time.process_time() - c0)
                    else:
                        made, path, skipped = restore(store, JOB, dest, AcceptedCheckpoint(step=1, sha256=ckpt.sha256,
                                                                                           epoch=r + 1))
                        assert made is not None and not skipped, skipped
                        down.append(size / (time.perf_counter() - t0))
                        cpu_down.append(time.process_time() - c0)
            t0 = time.perf_counter()
            files.hash_file(ckpt.path)  # the SHA-256 alone, from the page cache, on one core: ours' floor
            hash_alone = size / (time.perf_counter() - t0)
        finally:
            loop.kill()
            loop.wait()
        samples = [tuple(map(float, line.split())) for line in loop_log.read_text().splitlines() if line.strip()]
        base = [s for at, s in samples for kind, start, end in windows if kind == "base" and start <= at < end]
        busy = [s for at, s in samples for kind, start, end in windows if kind == "busy" and start <= at < end]
        return {"mb": size, "up": up, "raw_up": raw_up, "down": down, "raw_down": raw_down,
                "cpu_down": statistics.median(cpu_down), "cpu_raw_down": statistics.median(cpu_raw_down),
                "load": os.getloadavg()[0], "hash_alone": hash_alone, "cpus": os.cpu_count(),
                "base": statistics.median(base), "busy": statistics.median(busy), "busy_max": max(busy),
                "base_max": max(base)}
    finally:
        proc.kill()
        proc.wait()


async def _upload(store, local, upload, uploader_cls) -> None:
    done = asyncio.Event()
    uploader = uploader_cls(store, local, on_stored=lambda u, m, held: done.set(),
                            on_skipped=lambda u, name, why: done.set(), concurrency=4)
    uploader.submit(upload)
    await done.wait()
    await uploader.close()


def main(quick: bool = False, *, mb: int | None = None, rounds: int | None = None) -> list[dict]:
    mb = mb or (64 if quick else 1024)
    rounds = rounds or (1 if quick else 3)
    root = Path(tempfile.mkdtemp(prefix="teto-bench-store-"))
    try:
        m = measure(mb, rounds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for name, ours, ref in (("store_upload", m["up"], m["raw_up"]), ("store_download", m["down"], m["raw_down"])):
        fig, reference = statistics.median(ours), statistics.median(ref)
        rows.append({"name": name, "figure": round(fig, 1), "reference": round(reference, 1),
                     "ratio": round(fig / reference, 3), "target": UPLOAD_TARGET, "unit": "MB/s",
                     "passed": fig / reference >= UPLOAD_TARGET,
                     "note": f"{m['mb']:.0f} MB checkpoint, {rounds} rounds, SeaweedFS on loopback; reference: boto3 "
                             f"{'upload_file' if name == 'store_upload' else 'download_file'} (16 MB parts, 4 at once)"
                             + (f"; CPU seconds of ours {m['cpu_down']:.2f} against {m['cpu_raw_down']:.2f} (the "
                                f"difference: the SHA-256 of every byte, {m['hash_alone']:.0f} MB/s alone on one core "
                                f"here); load {m['load']:.1f} on {m['cpus']} cores"
                                if name == "store_download" else "")})
    ratio = m["busy"] / m["base"]
    rows.append({"name": "store_stall", "figure": round(m["busy"] * 1e3, 2), "reference": round(m["base"] * 1e3, 2),
                 "ratio": round(ratio, 3), "target": STALL_TARGET, "unit": "ms per training step",
                 "passed": ratio <= STALL_TARGET,
                 "note": f"a 1-thread training loop pinned to one core, median step while the agent uploads "
                         f"(the agent, client and server unpinned; upload threads at nice 10 and SCHED_IDLE, the server at nice 10) against the "
                         f"same loop with nothing uploading, as long before and after each upload (longest step {m['busy_max'] * 1e3:.1f} ms against "
                         f"{m['base_max'] * 1e3:.1f} ms); the run is never blocked by an upload"})
    return rows


def _cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mb", type=int)
    ap.add_argument("--rounds", type=int)
    a = ap.parse_args()
    for r in main(a.quick, mb=a.mb, rounds=a.rounds):
        print(f"{r['name']:15} {r['figure']:9} {r['unit']:22} reference {r['reference']:9} ratio {r['ratio']:6} "
              f"target {r['target']}  {'pass' if r['passed'] else 'short'}  ({r['note']})")


if __name__ == "__main__":
    _cli()
