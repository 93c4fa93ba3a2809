"""A gang worker's uncaught error read as a lost peer (teto/integrations/gang.py): by type and by where it was
raised, never by its text."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from teto.integrations import gang

pytestmark = pytest.mark.unit


def _raised(exc: BaseException, module: str) -> BaseException:
    """``exc`` as raised from a function of ``module``."""
    scope: dict = {"__name__": module, "exc": exc}
    exec("def fail():\n    raise exc\n", scope)
    try:
        scope["fail"]()
    except BaseException as caught:  # noqa: BLE001 - the point
        return caught
    raise AssertionError("not raised")


@pytest.mark.parametrize("module", ["torch.distributed.distributed_c10d", "torch.nn.parallel.distributed",
                                    "torch.distributed"], ids=str)
def test_an_error_out_of_a_collective_is_a_lost_peer(module):
    assert gang.is_peer_lost(_raised(RuntimeError("Connection reset by peer"), module))


@pytest.mark.parametrize("module", ["transformers.trainer", "torch.nn.modules.module", "torch.distributedish",
                                    "__main__"], ids=str)
def test_an_error_of_the_training_itself_is_not(module):
    assert not gang.is_peer_lost(_raised(RuntimeError("Connection reset by peer"), module))


def test_a_distributed_error_type_is_a_lost_peer_wherever_raised_and_through_its_causes():
    assert gang.is_peer_lost(_raised(dist.DistNetworkError("x"), "__main__"))
    try:
        try:
            raise _raised(RuntimeError("collective"), "torch.distributed.distributed_c10d")
        except RuntimeError as inner:
            raise ValueError("wrapped by the script") from inner
    except ValueError as outer:
        assert gang.is_peer_lost(outer)
    assert not gang.is_peer_lost(ValueError("never raised"))
