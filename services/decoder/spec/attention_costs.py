"""What decode / verify attention costs per key row, by path, for the verify budget.

The budget's step table (``verify_budget.CostTable``) prices a step by its batch tokens: the
projections and MLPs, whose cost does not depend on where the tokens are in their sequences. A
verified position's attention does: a dense query token reads its whole context, a sparse
(page-list) token scores every page of its context and gathers and attends its own selection.
On a 4K-token document under sparse attention with a 1K-token selection a page-list token costs
~20 ms of a 2-core CPU step: the table, profiled on a short context, priced 16-32-token sparse
verify steps at half what they took. So the step is priced as

    table(batch tokens) + sum over query tokens of seconds_per_row(path) x key rows(token),

with the rows counted as ``model.attention.AttentionWork`` counts them (the model runner says
what a request's next query token reads: ``ModelRunner.query_key_rows``), and the table learns
the step's seconds without its attention (and without host fetches, priced per missed page).

Each path's seconds per row is a moving average of what steps measure. Dense starts from the
start-up profile; page-list starts unknown (no charge) and is measured by the first step with a
sparse token: every decode step of a request beyond its selection budget is one.
"""

from __future__ import annotations

from services.decoder.model.attention import AttentionWork

PATHS = ("dense", "page_list")


class AttentionCosts:
    WEIGHT = 0.1  # of the newest step's measurement (the first one sets the figure)
    # a step with fewer rows than this on a path says little about it (timer resolution, the
    # fixed cost of a call): not observed
    MIN_ROWS = {"dense": 4096, "page_list": 1024}

    def __init__(self, dense_s_per_row: float | None = None):
        self.s_per_row: dict[str, float | None] = {"dense": dense_s_per_row, "page_list": None}

    def seconds(self, path: str, rows: int) -> float:
        """Seconds of ``rows`` key rows on ``path`` (0 while the path is unmeasured)."""
        rate = self.s_per_row[path]
        return 0.0 if rate is None else rate * rows

    def observe(self, work: AttentionWork) -> None:
        """One step's measured attention (its fetches taken out of the page-list seconds)."""
        for path, seconds, rows in (("dense", work.dense_s, work.dense_rows),
                                    ("page_list", work.page_list_s - work.fetch_s, work.page_list_rows)):
            if rows < self.MIN_ROWS[path] or seconds <= 0:
                continue
            rate, current = seconds / rows, self.s_per_row[path]
            self.s_per_row[path] = rate if current is None else current + self.WEIGHT * (rate - current)
