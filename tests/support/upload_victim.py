"""A process uploading one checkpoint to an S3 store through the agent's uploader, killed by its test midway.

``python -m tests.support.upload_victim ENDPOINT BUCKET KEYS_DIR CKPT_DIR JOB STEP MARKER``: uploads the
checkpoint ``step-<STEP>.pt`` of CKPT_DIR; once every object is stored and just before its manifest, it writes
MARKER and waits (the test SIGKILLs it there: the upload's last moment before its commit point)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from agents.executor.store.s3 import S3Config, S3Store
from agents.executor.store.uploader import Upload, Uploader


class Stalling(S3Store):
    def __init__(self, config: S3Config, marker: Path) -> None:
        super().__init__(config)
        self.marker = marker

    def put_bytes(self, key: str, data: bytes) -> None:
        if "/manifests/" in key:
            self.marker.write_text(key)
            time.sleep(600)
        super().put_bytes(key, data)


async def main() -> None:
    endpoint, bucket, keys, directory, job, step, marker = sys.argv[1:8]
    keys_dir = Path(keys)
    store = Stalling(S3Config(endpoint=endpoint, bucket=bucket,
                              access_key_id=(keys_dir / "access_key_id").read_text().strip(),
                              secret_access_key=(keys_dir / "secret_access_key").read_text().strip(),
                              part_bytes=5 << 20, concurrency=2), Path(marker))
    done = asyncio.Event()
    uploader = Uploader(store, Path(directory), on_stored=lambda u, m, held: done.set(),
                        on_skipped=lambda u, name, why: print("skipped", name, why, flush=True))
    uploader.submit(Upload(job_id=job, epoch=1, step=int(step), rel=f"step-{int(step):08d}.pt", sha256=None,
                           bytes=None, written_at="t"))
    await done.wait()


if __name__ == "__main__":
    asyncio.run(main())
