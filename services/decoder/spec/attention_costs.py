"""What decode / verify attention costs, by path, for the verify budget.

The budget's step table (``verify_budget.CostTable``) prices a step by its batch tokens: the
projections and MLPs, whose cost does not depend on where the tokens are in their sequences. A
verified position's attention does: a dense query token reads its whole context, a sparse
(page-list) token scores every page of its context and gathers and attends its own selection.
On a 4K-token document under sparse attention with a 1K-token selection a page-list token costs
~17 ms of a 2-core CPU step: the table, profiled on a short context, priced 16-32-token sparse
verify steps at half what they took. So the step is priced as

    table(batch tokens) + sum over paths in the step of (fixed_s + s_per_row x key rows),

with the rows counted as ``model.attention.AttentionWork`` counts them (the model runner says
what a request's next query token reads: ``ModelRunner.query_key_rows``), and the table learns
the step's seconds without its attention (and without host fetches, priced per missed page).

A path's cost is a line, not a rate: the page-list path spends ~1 ms per layer per step however
few tokens it serves (measured: 1 request x 1 token 49 ms for 46,680 rows, x 8 tokens 170 ms
for 8x the rows), and only the slope is what one more verified position costs. Each line is an
exponentially weighted least-squares fit of the steps measured while serving, its slope anchored
by the start-up profile's steps (``engine/step_profile.py``), which span 1 to 64 tokens: serving
steps alone often sit at one row count (every request decoding one token), where a fit has no slope.

The dense path is two lines in one: a request's group gathers its context's keys and values once
per layer whatever its query count, and each query token then scores them. So its seconds are
``fixed_s + s_per_context_row x context rows + s_per_query_row x the rows of query tokens beyond
each request's first``, and a drafted position costs only the second part. Priced per key row as
one line, a verify token at 6K tokens of context was priced like a decode token's whole read: at
dense long-document c=4 the drafted step was priced near twice the plain one where it took 1.17x,
and the gate left fixed k=1's 1.08-1.10x decode-phase gain unused. ``s_per_query_row`` is the
start-up profile's (its steps score 1 to 64 query tokens against one request's context); the
context line is fitted to serving steps after the query part is taken out.
"""

from __future__ import annotations

from services.decoder.model.attention import AttentionWork

PATHS = ("dense", "page_list")


class LineFit:
    """``seconds ~ fixed_s + s_per_row x rows`` over the measured steps (weight 1 each, decayed
    by ``DECAY`` per step), with the slope drawn towards the prior's (the profile's line) as
    much as ``PRIOR_WEIGHT`` steps spread like the profile's would draw it: with the steps at one
    row count the slope is the prior's and the fixed part what the steps say; the more the
    steps' row counts spread, the more their own slope counts. Neither coefficient goes below 0."""

    DECAY = 0.95  # ~20 steps of memory
    PRIOR_WEIGHT = 4.0

    def __init__(self, prior: tuple[tuple[int, float], ...] = ()):
        self._prior_line = (0.0, 0.0)
        self._prior_strength = 0.0  # PRIOR_WEIGHT x the prior's spread of rows (sum of squares)
        if prior:
            xs, ys = [float(x) for x, _ in prior], [y for _, y in prior]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            spread = sum((x - mx) ** 2 for x in xs) / len(xs)
            if spread > 0:
                slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (spread * len(xs))
                self._prior_line = (my - slope * mx, slope)
            else:  # one row count: a rate through 0
                self._prior_line, spread = (0.0, my / mx), mx * mx
            self._prior_strength = self.PRIOR_WEIGHT * spread
        self._data = [0.0] * 5  # weight, sum x, sum x^2, sum y, sum xy
        self.num_observed = 0

    def observe(self, rows: int, seconds: float) -> None:
        self._data = [self.DECAY * s for s in self._data]
        for i, term in enumerate((1.0, rows, rows * rows, seconds, rows * seconds)):
            self._data[i] += term
        self.num_observed += 1

    @property
    def known(self) -> bool:
        return self._prior_strength > 0 or self._data[0] > 0

    def line(self) -> tuple[float, float]:
        """``(fixed_s, s_per_row)``; ``(0, 0)`` with nothing measured."""
        n, sx, sxx, sy, sxy = self._data
        if n <= 0:
            return max(self._prior_line[0], 0.0), max(self._prior_line[1], 0.0)
        centred_xx = max(sxx - sx * sx / n, 0.0)
        centred_xy = sxy - sx * sy / n
        strength = self._prior_strength
        if centred_xx + strength <= 1e-12 * max(sxx, 1.0):  # one row count and no prior: a rate through 0
            return 0.0, max(sxy / sxx, 0.0) if sxx > 0 else 0.0
        slope = max((centred_xy + strength * self._prior_line[1]) / (centred_xx + strength), 0.0)
        fixed = (sy - slope * sx) / n
        if fixed < 0:  # rows cost more than in proportion: a rate through 0
            return 0.0, max(sxy / sxx, 0.0)
        return fixed, slope


class DenseFit:
    """The dense path: ``seconds ~ fixed_s + s_per_context_row x context rows + s_per_query_row x
    (rows - context rows)`` (module docstring). ``prior``: the start-up profile's steps,
    ``(rows, context rows, seconds)``; without a spread in their query rows the query part is not
    measured and a query row is priced like a context row (the one-line model)."""

    def __init__(self, prior: tuple[tuple[int, int, float], ...] = ()):
        query_rows = [(rows - context, s) for rows, context, s in prior]
        # None: the profile's steps have no spread of query rows to measure it
        self.s_per_query_row = LineFit(tuple(query_rows)).line()[1] if len(dict(query_rows)) > 1 else None
        self.context = LineFit(tuple((context, s - (self.s_per_query_row or 0.0) * (rows - context))
                                     for rows, context, s in prior))

    @property
    def num_observed(self) -> int:
        return self.context.num_observed

    def query_s_per_row(self) -> float:
        """What one more query row of a request whose context is gathered costs."""
        return self.context.line()[1] if self.s_per_query_row is None else self.s_per_query_row

    def observe(self, rows: int, context_rows: int, seconds: float) -> None:
        self.context.observe(context_rows, seconds - self.query_s_per_row() * (rows - context_rows))

    def seconds(self, rows: int, context_rows: int) -> float:
        fixed, s_per_context_row = self.context.line()
        return fixed + s_per_context_row * context_rows + self.query_s_per_row() * (rows - context_rows)


class AttentionCosts:
    """The two paths' fits, fed one ``AttentionWork`` per step."""

    # a step with fewer rows than this on a path says little about it (timer resolution): skipped
    MIN_ROWS = 1024

    def __init__(self, dense_prior: tuple[tuple[int, int, float], ...] = (),
                 page_list_prior: tuple[tuple[int, float], ...] = ()):
        """``dense_prior``: (rows, context rows, seconds); ``page_list_prior``: (rows, seconds)."""
        self.dense = DenseFit(dense_prior)
        self.page_list = LineFit(page_list_prior)

    def position_s(self, path: str, rows: int) -> float:
        """What one more query token reading ``rows`` key rows costs a request that attends on
        ``path`` anyway (0 while the path is unmeasured)."""
        if path == "dense":
            return self.dense.query_s_per_row() * rows
        return self.page_list.line()[1] * rows

    def seconds(self, path: str, rows: int, context_rows: int) -> float:
        """A step's seconds on ``path`` for ``rows`` key rows in all, of which ``context_rows``
        are its requests' contexts once each (page-list tokens each gather their own: there
        ``rows``); 0 rows: the path does not run."""
        if rows <= 0:
            return 0.0
        if path == "dense":
            return self.dense.seconds(rows, context_rows)
        fixed, slope = self.page_list.line()
        return fixed + slope * rows

    def observe(self, work: AttentionWork) -> None:
        """One step's measured attention (its fetches taken out of the page-list seconds)."""
        if work.dense_rows >= self.MIN_ROWS and work.dense_s > 0:
            self.dense.observe(work.dense_rows, work.dense_context_rows, work.dense_s)
        page_list_s = work.page_list_s - work.fetch_s
        if work.page_list_rows >= self.MIN_ROWS and page_list_s > 0:
            self.page_list.observe(work.page_list_rows, page_list_s)
