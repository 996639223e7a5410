"""Packing's slow variant: the packed step with dense attention (blockwise runs by default in
tests/integration/test_packing.py; the op is shared, blockwise adds the masked-block skipping)."""
import pytest

from integration.test_packing import test_packed_step_equals_unpacked as packed_step_equals_unpacked


@pytest.mark.parametrize("attention", ["dense"])
def test_packed_step_equals_unpacked(attention):
    packed_step_equals_unpacked(attention)
