import pytest

from services.decoder.kv.slot_allocator import OutOfSlotsError, SlotAllocator


def test_fresh_allocator_hands_out_lowest_ids_in_order():
    alloc = SlotAllocator(8)
    assert alloc.allocate(3) == [0, 1, 2]
    assert alloc.allocate(2) == [3, 4]
    assert alloc.free_slot_order() == [5, 6, 7]
    assert alloc.check_integrity()


def test_freed_slots_go_to_the_back_in_the_order_given():
    alloc = SlotAllocator(6)
    a = alloc.allocate(4)  # [0, 1, 2, 3]
    alloc.free([a[2], a[0]])
    assert alloc.free_slot_order() == [4, 5, 2, 0]
    assert alloc.allocate(3) == [4, 5, 2]
    assert alloc.free_slot_order() == [0]
    assert alloc.num_free_slots == 1 and alloc.num_used_slots == 5
    assert alloc.check_integrity()


def test_allocation_is_all_or_nothing():
    alloc = SlotAllocator(4)
    alloc.allocate(3)
    with pytest.raises(OutOfSlotsError, match="asked for 2 slots, 1 free"):
        alloc.allocate(2)
    assert alloc.free_slot_order() == [3]
    assert alloc.check_integrity()


@pytest.mark.parametrize("bad", [[7], [-1], [1, 1]])
def test_bad_free_changes_nothing(bad):
    alloc = SlotAllocator(4)
    alloc.allocate(2)
    before = alloc.free_slot_order()
    with pytest.raises(ValueError):
        alloc.free(bad)
    assert alloc.free_slot_order() == before
    assert alloc.check_integrity()


def test_double_free_is_rejected_without_partial_effect():
    alloc = SlotAllocator(4)
    got = alloc.allocate(2)  # [0, 1]
    alloc.free([got[0]])
    with pytest.raises(ValueError, match="already free"):
        alloc.free([got[1], got[0]])
    assert alloc.free_slot_order() == [2, 3, 0]
    assert alloc.check_integrity()


def test_zero_slots_is_rejected():
    with pytest.raises(ValueError):
        SlotAllocator(0)
