"""``teto tokens --help`` says where tokens live now: the gateway's PostgreSQL, not a tokens.json (issue 30)."""

from __future__ import annotations

import pytest

from teto.cli import build_parser


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_tokens_command_says_they_live_in_postgresql_through_the_gateway(capsys):
    text = _help(["tokens", "--help"], capsys)
    assert "PostgreSQL" in text and "gateway" in text, text
    # The file is only the --tokens-file fallback, named as such, never as where tokens are.
    before_options = text.split("options:")[0]
    assert "tokens.json" not in before_options, before_options


def test_the_command_list_no_longer_names_the_tokens_file(capsys):
    text = _help(["--help"], capsys)
    assert "tokens API tokens, kept by the gateway in PostgreSQL" in text, text
    assert "<data-dir>/tokens.json" not in text, text
