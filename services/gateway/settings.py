"""Typed settings of the gateway (HTTP listener, tokens file, command wait, body limit)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from libs.runtime.settings import CommonSettings


class GatewaySettings(CommonSettings):
    http_host: str = Field("127.0.0.1", min_length=1, max_length=255, description="Address the HTTP API binds")
    http_port: int = Field(8080, ge=0, le=65535, description="Port of the HTTP API (0 picks a free one)")
    tokens_file: Path | None = Field(None, description="API tokens (hashes only); default data_dir/tokens.json")
    command_timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="How long a request waits for a command's outcome before answering 202"
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, le=64 << 20, description="Larger request bodies get 413")
    default_page_size: int = Field(100, ge=1, le=10_000, description="Rows per list response when not asked")

    @property
    def effective_tokens_file(self) -> Path:
        return self.tokens_file or (self.data_dir / "tokens.json")
