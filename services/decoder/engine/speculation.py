"""The engine's speculation: which drafter, what it drafts each step, how much of it to verify.

Every step, each running request that decodes (one pending token) with room left asks the
drafter for a block; all requests draft in one drafter call. With the adaptive verify budget
(``spec/verify_budget.py``) the block is cut to the length that maximises expected committed
tokens per second of step time, from the drafter's per-position confidences (DSpark) or the
request's running acceptance rate, the step costs profiled at start-up, and, for a SPARSE
request, the host fetches its larger working set costs. After the step, a drafter that
conditions on the target gets the committed positions' features (never rejected rows).
"""

from __future__ import annotations

import torch

from services.decoder.config import DecoderConfig
from services.decoder.engine.request import Request, Residency
from services.decoder.model.llama import LlamaModel
from services.decoder.spec.dflash.drafter import shipped_checkpoint
from services.decoder.spec.drafter import Drafter, DraftRequest, make_drafter
from services.decoder.spec.verify_budget import StepCostTable, choose_draft_lengths


def build_drafter(config: DecoderConfig, target: LlamaModel) -> Drafter | None:
    if config.spec == "ngram":
        return make_drafter("ngram", min_n=config.ngram_min_n, max_n=config.ngram_max_n)
    if config.spec in ("dflash", "dspark"):
        checkpoint = config.draft_model or shipped_checkpoint(config.spec)
        return make_drafter(config.spec, target=target, checkpoint=checkpoint)
    return make_drafter(config.spec)


class Speculator:
    def __init__(self, drafter: Drafter, spec_tokens: int):
        self.drafter = drafter
        self.spec_tokens = spec_tokens
        self.step_costs: StepCostTable | None = None  # set by the adaptive budget's profiling
        self.fetch_s_per_page_layer = 0.0

    def propose(self, running: list[Request]) -> None:
        """Sets ``draft_ids`` of every running request that decodes next step."""
        drafting: list[Request] = []
        asks: list[DraftRequest] = []
        for request in running:
            room = request.max_total_len - request.num_tokens - 1  # the bonus token must fit too
            if request.num_pending_tokens == 1 and room > 0:
                drafting.append(request)
                asks.append(DraftRequest(request.request_id, request.prompt_ids + request.output_ids,
                                         min(self.spec_tokens, room)))
        if not asks:
            return
        drafts = self.drafter.propose_batch(asks)
        if self.step_costs is not None:
            lengths = choose_draft_lengths(
                [d.confidences or [r.acceptance.rate] * len(d.tokens) for r, d in zip(drafting, drafts)],
                committed_base=len(running), tokens_base=len(running), costs=self.step_costs,
                fetch_s_per_position=[self.fetch_s_per_position(r) for r in drafting])
            for request, draft, length in zip(drafting, drafts, lengths):
                if draft.tokens and length == 0:
                    request.acceptance.idle()
                draft.tokens = draft.tokens[:length]
        for request, draft in zip(drafting, drafts):
            request.draft_ids = draft.tokens

    def fetch_s_per_position(self, request: Request) -> float:
        """A SPARSE request's extra verified position fetches its measured misses per query token."""
        if request.mode is not Residency.SPARSE:
            return 0.0
        misses_per_token = request.stats.num_buffer_misses / max(len(request.output_ids), 1)
        return misses_per_token * self.fetch_s_per_page_layer

    def observe(self, request: Request, start: int, features: torch.Tensor | None, first_row: int) -> None:
        """``features``: the step's captured features; the request's committed positions
        ``start .. request.num_computed_tokens`` occupy rows from ``first_row`` on."""
        if features is not None:
            self.drafter.observe(request.request_id, start,
                                 features[first_row : first_row + request.num_computed_tokens - start])

    def release(self, request: Request) -> None:
        self.drafter.release(request.request_id)
