"""`collection_paused`: the cyclic collector off for a block, then as it was."""

from __future__ import annotations

import gc

import pytest

from foundation.gc_pause import collection_paused


def test_the_collector_is_off_inside_and_on_again_after_even_on_an_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_paused():
        assert not gc.isenabled()
        raise RuntimeError("a failed solve")
    assert gc.isenabled()


def test_a_caller_that_keeps_it_off_finds_it_off():
    gc.disable()
    try:
        with collection_paused():
            with collection_paused():
                pass
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
