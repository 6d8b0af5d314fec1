"""What the adaptive verify budget prices a step's target pass at (``engine/speculation.py``).

A step's seconds are the step table's at its batch tokens (``CalibratedCosts``, corrected by the
steps served), plus, where the start-up profile timed attention apart, each decode / verify
token's attention per key row it reads (``AttentionCosts``: a token 4K positions into a document
costs more than one 100 positions in), plus, for a SPARSE request, the host fetches its buffer
misses cost per query token. Prefill chunks' attention is in the table.
"""

from __future__ import annotations

from collections.abc import Callable

from services.decoder.engine.request import Request, Residency
from services.decoder.engine.scheduler import ScheduledRequest
from services.decoder.model.attention import AttentionWork
from services.decoder.spec.attention_costs import PATHS, AttentionCosts
from services.decoder.spec.verify_budget import BudgetProfile, CalibratedCosts, MachineSpeed


class StepPrices:
    def __init__(self, profile: BudgetProfile, speed: MachineSpeed,
                 query_key_rows: Callable[[Request], tuple[str, int]] | None):
        """``profile``: the start-up profile whose tables serving corrects; ``speed``: the
        machine's, shared with the drafter's table; ``query_key_rows``: what one query token of a
        request attends next step (path, key rows; ``ModelRunner.query_key_rows``); None, or a
        profile without attention points: attention is priced inside the step table."""
        self.step_costs = CalibratedCosts(profile.step_costs, speed)
        self.attention_costs: AttentionCosts | None = None
        if query_key_rows is not None and (profile.dense_attention_points or profile.page_list_attention_points):
            self.attention_costs = AttentionCosts(profile.dense_attention_points, profile.page_list_attention_points)
        self.query_key_rows = query_key_rows
        self.fetch_s_per_page_layer = profile.fetch_s_per_page_layer

    def attend_s_per_position(self, request: Request) -> float:
        """The attention of one more query token of ``request`` next step (0 when the table holds it)."""
        if self.attention_costs is None:
            return 0.0
        return self.attention_costs.position_s(*self.query_key_rows(request))

    def attend_s(self, tokens: list[tuple[Request, int]]) -> float:
        """A step's decode / verify attention: ``tokens`` = (request, its query tokens); each path
        that runs costs its fixed part once (0 when the table holds attention)."""
        if self.attention_costs is None:
            return 0.0
        rows, context_rows = dict.fromkeys(PATHS, 0), dict.fromkeys(PATHS, 0)
        for request, num_tokens in tokens:
            path, per_token = self.query_key_rows(request)
            rows[path] += num_tokens * per_token
            context_rows[path] += per_token
        return sum(self.attention_costs.seconds(path, rows[path], context_rows[path]) for path in PATHS)

    def fetch_s_per_position(self, request: Request) -> float:
        """A SPARSE request's extra verified position fetches its measured misses per query token."""
        if request.mode is not Residency.SPARSE:
            return 0.0
        misses_per_token = request.stats.num_buffer_misses / max(len(request.output_ids), 1)
        return misses_per_token * self.fetch_s_per_page_layer

    def decodes_s(self, decoding: list[tuple[Request, int]], other_tokens: int = 0) -> float:
        """A step of ``decoding`` (request, its query tokens: 1 + its draft) beside
        ``other_tokens`` prefill-chunk tokens."""
        tokens = other_tokens + sum(n for _, n in decoding)
        return (self.step_costs.seconds_at(tokens) + self.attend_s(decoding)
                + sum(n * self.fetch_s_per_position(r) for r, n in decoding))

    def batch_s(self, batch: list[ScheduledRequest]) -> float:
        """``batch``'s target pass (its decode / verify requests and its prefill chunks)."""
        decoding = [(s.request, s.num_query_tokens) for s in batch if s.num_new_tokens == 1]
        return self.decodes_s(decoding, sum(s.num_query_tokens for s in batch if s.num_new_tokens != 1))

    def observe(self, num_tokens: int, seconds: float, attention: AttentionWork | None,
                shape_weight: float | None = None) -> None:
        """A step's measured target pass: its attention into the fits (where they price it), the
        rest into the table (``CalibratedCosts.observe``'s ``shape_weight``)."""
        if self.attention_costs is not None and attention is not None:
            self.attention_costs.observe(attention)
            seconds -= attention.seconds
        self.step_costs.observe(num_tokens, seconds, shape_weight)
