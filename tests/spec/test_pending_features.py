"""``PendingFeatures``: the DFlash drafter's observed, not yet projected features, rows of one
shared buffer. Checked against a per-request list of the positions' features."""

import pytest
import torch

from services.decoder.spec.dflash.pending_features import PendingFeatures


@pytest.mark.parametrize("rejected", [2, 0])  # 0: most steps commit every row (copied whole)
def test_each_request_gets_back_the_last_window_rows_it_observed_and_no_row_leaks(rejected):
    window = 6
    store = PendingFeatures(window)
    store.INITIAL_ROWS = 4  # the buffer grows several times
    torch.manual_seed(0)
    reference: dict[str, tuple[int, list[torch.Tensor]]] = {}  # request -> (first position, rows)
    ends = {"a": 0, "b": 0, "c": 0}
    for step in range(12):
        counts = {"a": 1, "b": 3 if step % 4 else 9, "c": 0 if step % 3 else 2}  # b's 9: past the window
        items, row = [], 0
        for request_id, n in counts.items():
            start = ends[request_id]
            if step == 7 and request_id == "a":
                start = 2  # a jump back (a recomputed request): pending starts anew
            if n:
                items.append((request_id, start, row, n))
                row += n
        features = torch.randn(row + rejected, 5)  # rows no request committed (rejected drafts)
        store.add_step(features, items)
        for request_id, start, first_row, n in items:
            first, rows = reference.get(request_id, (start, []))
            if start != first + len(rows):
                first, rows = start, []
            rows = rows + list(features[first_row : first_row + n].clone())
            reference[request_id] = (first, rows)
            ends[request_id] = start + n
        features.zero_()  # the step's tensor is not kept
        held = sum(store.num_rows(r) for r in ends)
        assert held + len(store.free) == store.buffer.shape[0] and len(set(store.free)) == len(store.free)
    for request_id in ("a", "b"):
        first, rows = reference[request_id]
        start, got = store.take(request_id)
        want = torch.stack(rows[-window:])
        assert start == first + len(rows) - len(want) and start + len(got) == ends[request_id]
        assert torch.equal(got, want)
    assert store.take("a") is None  # taken: nothing pending
    store.drop("c")
    assert len(store.free) == store.buffer.shape[0] and store.held == {}
