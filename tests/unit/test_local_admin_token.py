"""`teto up` reuses its local admin token while the gateway would still accept it, and makes a new one after
the old one was revoked."""

import pytest

from services.gateway.auth import list_tokens, revoke_token
from teto.stack.up import _admin_token, _write_private

pytestmark = pytest.mark.unit


def test_the_local_admin_token_is_reused_while_valid_and_replaced_once_revoked(tmp_path):
    tokens = tmp_path / "tokens.json"
    first = _admin_token(tmp_path, tokens)
    _write_private(tmp_path / "stack.json", {"admin_token": first})
    assert _admin_token(tmp_path, tokens) == first
    assert len(list_tokens(tokens)) == 1
    revoke_token(tokens, list_tokens(tokens)[0]["id"])
    assert _admin_token(tmp_path, tokens) != first
