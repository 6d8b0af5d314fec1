import pytest

from services.kvtier.allocator import HostPageAllocator, OutOfHostPagesError


def test_fresh_pool_hands_out_lowest_ids_in_order():
    alloc = HostPageAllocator(8)
    assert alloc.peek(3) == [0, 1, 2]
    assert alloc.allocate(3) == [0, 1, 2]
    assert alloc.allocate(2) == [3, 4]
    assert alloc.free_page_order() == [5, 6, 7]
    assert alloc.check_integrity()


def test_freed_pages_go_to_the_back_in_the_order_given():
    alloc = HostPageAllocator(6)
    got = alloc.allocate(4)
    alloc.free([got[2], got[0]])
    assert alloc.free_page_order() == [4, 5, 2, 0]
    assert alloc.allocate(3) == [4, 5, 2]
    assert (alloc.num_free_pages, alloc.num_used_pages) == (1, 5)
    assert alloc.check_integrity()


def test_allocation_is_all_or_nothing():
    alloc = HostPageAllocator(4)
    alloc.allocate(3)
    with pytest.raises(OutOfHostPagesError, match="asked for 2 host pages, 1 free"):
        alloc.allocate(2)
    with pytest.raises(OutOfHostPagesError):
        alloc.peek(2)
    assert alloc.free_page_order() == [3]
    assert alloc.check_integrity()


@pytest.mark.parametrize("bad", [[9], [-1], [1, 1], [0, 3]])
def test_bad_free_changes_nothing(bad):
    alloc = HostPageAllocator(4)
    alloc.allocate(2)  # 0, 1 used; 3 is free
    before = alloc.free_page_order()
    with pytest.raises(ValueError):
        alloc.free(bad)
    assert alloc.free_page_order() == before
    assert alloc.check_integrity()


def test_restored_pool_queues_unused_pages_ascending():
    alloc = HostPageAllocator(6, used_pages=[4, 1, 2])
    assert alloc.free_page_order() == [0, 3, 5]
    assert alloc.num_used_pages == 3
    assert alloc.check_integrity()
    with pytest.raises(ValueError, match="used twice"):
        HostPageAllocator(6, used_pages=[1, 1])
    with pytest.raises(ValueError, match="out of range"):
        HostPageAllocator(6, used_pages=[6])
