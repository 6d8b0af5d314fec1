"""The engine's speculation: which drafter, what it drafts each step, how much of it to verify.

Every step, each running request that decodes (one pending token) with room left asks the drafter
for a block; all requests draft in one drafter call. With the adaptive verify budget
(``spec/verify_budget.py``) the block is cut to the length that maximises expected committed tokens
per second of step time, from the drafter's per-position confidences (mapped to the survival
verification measured for them: ``ConfidenceCalibration``) or, for n-gram, the pooled survival per
draft position (``DepthSurvival``) scaled by the request's own (``RequestSurvival``), and the
step's price (``spec/step_prices.py``: step table, attention per key row, SPARSE host fetches).
Before the call, the gate asks whether drafting can pay for the drafter's forward at all; the
requests for which no draft would pay are left out, and with none left the drafter does not run
(the estimates that kept it off relax, so it probes again later; while it keeps skipping it asks
only every few steps, and plain and control steps measure the base it prices:
``spec/gate_schedule.py``). Every drafting step reports its seconds (proposal and target pass)
against the gate's price, and a shortfall raises the gain a draft must promise (``RealizedGain``).
A request that drafts is asked for its predicted length only (+ ``LENGTH_HEADROOM`` with
confidences): a block drafter then scores only those positions, which on a 2-core CPU lets 1-2
token drafts pay at c=1.

The pooled profile (``Speculator.depth``) counts every verified draft of every request, from the
drafter's ``prior_acceptance`` (its measured held-out acceptance): a drafter known to accept
little is not probed at a guessed 0.7 by every request. Both cost tables start from the start-up
profile and are corrected by the step and drafter times measured (``CalibratedCosts``). After
the step, a drafter that conditions on the target gets the committed positions' features.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from services.decoder.engine.request import Request
from services.decoder.model.attention import AttentionWork
from services.decoder.spec.confidence_calibration import ConfidenceCalibration
from services.decoder.spec.depth_survival import DepthSurvival, RequestSurvival
from services.decoder.spec.drafter import Drafter, DraftRequest
from services.decoder.spec.gate_schedule import GateSchedule
from services.decoder.spec.realized_gain import RealizedGain
from services.decoder.spec.step_prices import StepPrices
from services.decoder.spec.verify_budget import (BudgetProfile, CalibratedCosts, DraftPlan, MachineSpeed,
                                                  choose_draft_plan, expected_committed)


class Speculator:
    # draft positions a drafter with confidences is asked for beyond the gate's predicted length
    # (priced by the gate). One without confidences gets none: after its call the budget knows
    # nothing new of the draft, so the headroom was verified on a sunk-cost price (c=4: 9-token
    # steps where fixed k=1 ran 8, 5 ms dearer)
    LENGTH_HEADROOM = 1
    # the drafter runs only if the step's drafts promise this much more throughput than none (a
    # margin for the noise of the estimates that picked them; more with more requests decoding:
    # ``GateSchedule.extra_gain``): 8% at c=4 kept it off 60% of the steps where fixed k=1 ran
    # 1.03-1.15x, and a flat 5% at c=1 cut dflash from 1.08x to 1.01x
    MIN_GAIN = 0.02
    # standard errors above its estimate the gate reads depth 0 at (a drafter with confidences),
    # shared out over the requests decoding (``GateSchedule``'s docstring: "Optimism")
    GATE_OPTIMISM = 1.0
    COST_RELAX = 0.02  # of the cost correction and pooled counts undone per skipped step (``relax``)
    def __init__(self, drafter: Drafter, spec_tokens: int,
                 query_key_rows: Callable[[Request], tuple[str, int]] | None = None):
        """``query_key_rows``: what one query token of a request attends next step (path, key
        rows; ``ModelRunner.query_key_rows``); None: attention is priced inside the step table."""
        self.drafter = drafter
        self.spec_tokens = spec_tokens
        self.query_key_rows = query_key_rows
        self._profile: BudgetProfile | None = None
        self.num_drafter_calls = 0
        self.reset_estimates()
        self._confidences: dict[str, list[float]] = {}  # request -> its pending draft's raw confidences
        self._cut: dict[str, list[float]] = {}  # request -> calibrated survival of its pending draft's cut positions
        self.plan: DraftPlan | None = None  # the adaptive budget's choice for the coming step (None: no draft verified)
        self._promise: tuple[int, DraftPlan] | None = None  # (requests, the gate's plan) if the drafter ran
        self._promised_s = 0.0  # what that step is held to: the plan after the call + the call's price
        self._propose_s = 0.0  # the coming step's proposal (drafter call, budget), its backlog apart
        self._backlog = (0.0, 0)  # the coming step's deferred context work: (seconds, positions)
        self._control: int | None = None  # requests of the coming control step (no drafts, measured)
        self._plain: tuple[int, float] | None = None  # (requests, base seconds) of a step the gate skipped or rested
        self._prefill_tokens = 0  # the coming step's prefill-chunk tokens beside its decodes
        self._decoding: list[Request] = []  # the coming step's requests that decode (``_propose``)
        self._step_base_s: float | None = None  # the coming step's base, once priced (``_base_s``)
        self._resting = False  # the gate sits the coming step out (``_rest``)

    def reset_estimates(self) -> None:
        """Back to what serving has not measured yet: the pooled survival at the drafter's prior,
        identity calibration, the gate's schedule anew and the start-up profile's tables
        uncorrected (``RealizedGain`` with them). A benchmark calls it after its warm-up: decoding
        one prompt 4 times over taught DSpark's pooled profile 0.83 at depth 0 where its prior is
        0.51, and the first measured decode at c=16 drafted on that (0.965x of no speculation)."""
        self.depth = DepthSurvival(self.drafter.prior_acceptance, max(self.spec_tokens, 1))  # pooled survival per position
        self.schedule = GateSchedule()  # when the gate asks, and the control steps that measure its base
        self.calibration = ConfidenceCalibration()  # the drafter's confidences vs measured survival
        self.profile = self._profile  # the tables, RealizedGain and attention costs anew

    @property
    def profile(self) -> BudgetProfile | None:
        return self._profile

    @profile.setter
    def profile(self, profile: BudgetProfile | None) -> None:
        """The adaptive budget's start-up profile; serving corrects its tables as it measures."""
        self._profile = profile
        speed = MachineSpeed()  # the machine's, for the target and the drafter alike
        self.prices = None if profile is None else StepPrices(profile, speed, self.query_key_rows)
        self.step_costs = None if profile is None else self.prices.step_costs
        self.draft_costs = None if profile is None else CalibratedCosts(profile.draft_costs, speed)
        self.realized = RealizedGain()  # promises of the new tables

    @property
    def promise(self) -> DraftPlan | None:
        """The gate's plan for the coming step when its drafter ran (what ``realized`` holds it to)."""
        return None if self._promise is None else self._promise[1]

    def observe_step(self, num_tokens: int, seconds: float, attention: AttentionWork | None = None,
                     decoded: tuple[int, int] | None = None) -> None:
        """The target pass of a step: ``num_tokens`` batch tokens took ``seconds``, of which
        ``attention`` (decode / verify attention, host fetches included) is priced per key row
        and the rest by the step table. ``decoded``: (requests, tokens committed) of a step in
        which every request decoded (no prefill chunk); a step whose drafter ran reports it
        against the gate's promise (``RealizedGain``). A step the gate sat out (``_rest``) is
        measured at its next ask, in order (``_catch_up``): after the forward every operation runs
        cold (~75 us for ~10 us of work at c=16), and nothing reads the estimates between."""
        if self.step_costs is None:
            return
        promise, self._promise = self._promise, None
        control, self._control = self._control, None
        plain, self._plain = self._plain, None
        if self._resting:
            self.schedule.unmeasured.append((num_tokens, seconds, attention, decoded, plain))
            return
        self._catch_up()
        if promise is not None:
            self.schedule.measured_drafting_step(self.step_costs.table.padded(num_tokens))
            if decoded is not None and decoded[0] == promise[0]:
                backlog_s = RealizedGain.steady_backlog_s(*self._backlog, promise[1].expected_committed)
                self.realized.observe(self._promised_s, seconds + self._propose_s + backlog_s, backlog_s)
        self._measure(num_tokens, seconds, attention, decoded, plain, control, promise is not None)

    def _measure(self, num_tokens: int, seconds: float, attention: AttentionWork | None,
                 decoded: tuple[int, int] | None, plain: tuple[int, float] | None, control: int | None,
                 drafted: bool = False) -> None:
        """A step's target pass into the cost tables and, for a plain step (no drafts, every
        request decoding), the measured base and the plain step's report against its price."""
        if not drafted and decoded is not None and num_tokens == decoded[0]:
            self.schedule.measured_plain_step(num_tokens, seconds)  # the base the gate prices
            if plain is not None and plain[0] == num_tokens:
                self.realized.observe_plain(plain[1], seconds)  # held to the base it was priced at
        is_control = control is not None and decoded is not None and decoded[0] == control
        self.prices.observe(num_tokens, seconds, attention, self.schedule.CONTROL_WEIGHT if is_control else None)

    def record(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        """A verified draft: the request's survival, the pooled profile and the confidences' calibration."""
        expected, survival = self.depth.expected(num_drafted, num_accepted), self.survival(request)
        self.depth.observe(num_drafted, num_accepted, 1.0 if self.drafter.has_confidences else survival.scale)
        survival.update(num_accepted, expected)
        cut = self._cut.pop(request.request_id, None)
        if cut and num_accepted == num_drafted:
            self.depth.impute(num_drafted, cut)
        confidences = self._confidences.pop(request.request_id, None)
        if confidences:
            self.calibration.observe(confidences[:num_drafted], num_accepted)

    def survival(self, request: Request) -> RequestSurvival:
        """The request's survival against the pooled profile; a new request's is the profile's."""
        if request.survival is None:
            request.survival = RequestSurvival()
        return request.survival

    def propose(self, running: list[Request], prefill_tokens: int = 0) -> None:
        """Sets ``draft_ids`` of every running request that decodes next step; ``prefill_tokens``:
        the prefill-chunk tokens the step schedules beside the decodes (``Scheduler.prefill_tokens``)."""
        start = time.perf_counter()
        self._backlog = (0.0, 0)
        self._prefill_tokens = prefill_tokens
        self._propose(running)
        self._propose_s = time.perf_counter() - start - self._backlog[0]

    def _propose(self, running: list[Request]) -> None:
        drafting: list[Request] = []  # the candidates: decoding, with room for a draft
        max_tokens: list[int] = []
        self.plan = None
        self._promise = self._control = self._plain = self._step_base_s = None
        self._resting, self._decoding = False, []  # one pass over the batch: the gate reads it often
        for request in running:
            num_tokens = request.num_tokens
            if num_tokens - request.num_computed_tokens == 1:
                self._decoding.append(request)
                room = request.max_total_len - num_tokens - 1  # the bonus token must fit too
                if room > 0:
                    drafting.append(request)
                    max_tokens.append(min(self.spec_tokens, room))
        if (self.profile is not None and drafting and not self._prefill_tokens
                and len(self._decoding) == len(running)
                and self.schedule.control_due(self.step_costs.table.padded(len(running)))):
            self._control = len(running)  # this step measures the base the gate compares against
            drafting = []
        if self.profile is not None and drafting:
            if self.schedule.rests(len(drafting)):
                self._rest(drafting, len(running))
                drafting = []
            else:
                self._catch_up()
                probe = self.schedule.probe_lengths(max_tokens, self.depth.unmeasured())
                drafting, max_tokens, promise = self._worth_the_drafter(running, drafting, max_tokens, probe)
            if drafting:
                self._promise = (len(running), promise)
        self.schedule.proposed(bool(drafting))
        if not drafting:
            return
        # token lists only for the requests that draft (a copy of the whole sequence each)
        asks = [DraftRequest(r.request_id, r.prompt_ids + r.output_ids, n) for r, n in zip(drafting, max_tokens)]
        # the deferred context work is timed apart, out of the call's table (its steady share is
        # priced as ``realized.context_s``): it is owed for every committed position whether this
        # step drafts or a later one does, and a long idle stretch's backlog charged to the next
        # call made the drafter look dearer the longer it skipped (c=1: drafted on 25% of steps)
        start = time.perf_counter()
        positions = self.drafter.prepare([a.request_id for a in asks])
        self._backlog = (time.perf_counter() - start, positions)
        start = time.perf_counter()
        drafts = self.drafter.propose_batch(asks)
        draft_s, call_s = time.perf_counter() - start, 0.0
        if self.draft_costs is not None:
            # the table prices one position per request: the modelled rest is taken off first
            extra_s = self.profile.draft_s_per_position(len(asks)) * (sum(a.max_tokens for a in asks) - len(asks))
            call_s = self.draft_costs.seconds_at(len(asks)) + extra_s + self.realized.context_s  # the call's price
            self.draft_costs.observe(len(asks), draft_s - extra_s)
        self.num_drafter_calls += 1
        if self.profile is not None:
            survivals = [self.calibration(d.confidences) if d.confidences else self._gate_survival(r, len(d.tokens))
                         for r, d in zip(drafting, drafts)]
            plan = self._plan(self._decoding, drafting, survivals)
            # the step is held to what it runs: a draft the confidences cut or lengthened is
            # priced as such (a lengthened one read as the gate's shortfall: at c=1 a 3-row step
            # costs 27% more than a 2-row one, and one such step put the gate off for ~10 steps)
            self._promised_s = plan.seconds + call_s
            lengths = plan.lengths
            if any(lengths):
                self.plan = plan
            if self.drafter.has_confidences and self._promise is not None:
                # what the confidences kept of what the gate expected before its survival scale (a
                # scale measured against the scaled expectation would read a corrected bias as
                # none and drift back): ``RealizedGain.survival_scale``
                unscaled = sum(expected_committed(self.depth.rates(n)) - 1 for n in self._promise[1].lengths if n)
                kept = sum(expected_committed(s[:n]) - 1 for s, n in zip(survivals, lengths) if n)
                self.realized.observe_tokens(unscaled, kept)
            self._age([r for r, d, n in zip(drafting, drafts, lengths) if d.tokens and n == 0])
            for request, draft, length, survival in zip(drafting, drafts, lengths, survivals):
                if draft.confidences and length < len(draft.tokens):
                    # the positions cut by their confidences count in the pooled profile at them
                    # (``DepthSurvival.impute``): now for a draft cut whole, after verification
                    # (if all it verified survived) for a draft cut short
                    if length == 0:
                        self.depth.impute(0, survival)
                    else:
                        self._cut[request.request_id] = survival[length:]
                draft.tokens = draft.tokens[:length]
        for request, draft in zip(drafting, drafts):
            request.draft_ids = draft.tokens
            if draft.confidences and draft.tokens:
                self._confidences[request.request_id] = draft.confidences[: len(draft.tokens)]
            else:
                self._confidences.pop(request.request_id, None)

    def _worth_the_drafter(self, running, drafting, max_tokens, probe):
        """Keeps the requests whose predicted draft (predicted survival, at most the ``probe``
        lengths or, where none of those pays, ``max_tokens``: ``GateSchedule.probe_lengths``)
        would pay for the drafter's forward, charged once for the call, and limits each to its
        predicted length (+ ``LENGTH_HEADROOM`` with confidences): the drafter then scores only
        those positions (its heads run per position), and confidences may still cut the draft or
        use the headroom. The required gain (``MIN_GAIN`` + ``GateSchedule.extra_gain``) is raised
        by the shortfall of recent drafting steps against their promises (``RealizedGain``).
        Returns the kept requests, their asks and the gate's plan."""
        draft_s = self.draft_costs.seconds_at(len(drafting)) + self.realized.context_s  # 1 position each + context
        min_gain = self.realized.required_gain(self.MIN_GAIN + self.schedule.extra_gain(len(self._decoding)))
        per_position_s = self.profile.draft_s_per_position(len(drafting))
        headroom = self.LENGTH_HEADROOM if self.drafter.has_confidences else 0
        for max_tokens in dict.fromkeys((tuple(probe), tuple(max_tokens))):  # probe's, then all
            survivals = [self._gate_survival(r, n) for r, n in zip(drafting, max_tokens)]
            plan = self._plan(self._decoding, drafting, survivals, draft_s, min_gain, per_position_s, headroom * per_position_s)
            if any(plan.lengths):
                break
        predicted = plan.lengths
        keep = [i for i, length in enumerate(predicted) if length > 0]
        if not keep:
            self._skip(drafting, len(running), plan.seconds)  # the base: the empty plan's seconds
            self.schedule.asked_base = (len(self._decoding), plan.seconds)
        else:
            self._age([r for r, length in zip(drafting, predicted) if length == 0])
        if headroom and keep:
            # one more verified token: the step's next row + asking the drafter for it, at the plan's rate
            tokens = len(self._decoding) + self._prefill_tokens + sum(predicted)
            step_s = max(self.step_costs.seconds_at(tokens + 1) - self.step_costs.seconds_at(tokens), 0.0)
            rate = plan.expected_committed / plan.seconds
            headrooms = [headroom if self._could_lengthen(drafting[i], predicted[i], rate, step_s + per_position_s)
                         else 0 for i in keep]
        else:
            headrooms = [0] * len(keep)
        asks = [min(max_tokens[i], predicted[i] + extra) for i, extra in zip(keep, headrooms)]
        return [drafting[i] for i in keep], asks, plan

    def _could_lengthen(self, request: Request, length: int, rate: float, position_s: float) -> bool:
        """Whether one more position than ``length`` could pay for ``request`` this step (``rate``:
        the plan's tokens per second; ``position_s``: the step's next row and the drafter's price of
        it) at the calibration's best survival per depth. At c=1 a third row costs 20-27% more than a
        second, and on code the second position survived 0 of 12 times at the highest confidences:
        the headroom cost 0.45 ms of every 33 ms step, two-token drafts lost to one-token ones."""
        alive = math.prod(self.calibration.best(depth) for depth in range(length + 1))
        return alive > rate * (position_s + self.prices.fetch_s_per_position(request)
                               + self.prices.attend_s_per_position(request))

    def _skip(self, candidates: list[Request], num_running: int, base_s: float) -> None:
        """A step where no draft could pay for the drafter (asked or resting): the candidates'
        evidence ages, and the drafter's cost correction, the realized shortfall and survival
        scale, and the pooled profile relax (at the gate's next ask: ``_catch_up``); its plain step
        is held to ``base_s`` (``RealizedGain.observe_plain``)."""
        self._plain = (num_running, base_s)
        self._age(candidates)
        self.schedule.skipped()

    def _rest(self, candidates: list[Request], num_running: int) -> None:
        """A skipped step the gate sits out (``GateSchedule.rests``), held to the base it priced at
        its last ask (as many requests decoding) and measured at its next: a gate that never
        drafts must cost next to nothing (pricing the base took ~35 us of a c=16 step, cold)."""
        self._resting = True
        num_decoding, base_s = self.schedule.asked_base
        if num_decoding != len(self._decoding):
            base_s = self._base_s(self._decoding)
        self._skip(candidates, num_running, base_s)

    def _catch_up(self) -> None:
        """Measures the steps the gate sat out (``observe_step``) and relaxes the estimates once for
        the steps skipped since it last asked, as that many ``relax(COST_RELAX)`` calls would have."""
        unmeasured, self.schedule.unmeasured = self.schedule.unmeasured, []
        for measurement in unmeasured:
            self._measure(*measurement, control=None)
        skips, self.schedule.unrelaxed = self.schedule.unrelaxed, 0
        if skips:
            rate = 1.0 - (1.0 - self.COST_RELAX) ** skips  # moves towards a fixed target compound so
            self.draft_costs.relax(rate)
            self.realized.relax(rate)
            self.depth.relax(self.COST_RELAX, skips)

    def _age(self, requests: list[Request]) -> None:
        """Ages the evidence of ``requests``' own survival (a step that verifies none of their
        draft); it scales only the drafts of a drafter without confidences (``_gate_survival``)."""
        if not self.drafter.has_confidences:
            for request in requests:
                self.survival(request).idle()

    def _gate_survival(self, request: Request, num_positions: int) -> list[float]:
        """The per-position survival the gate predicts a request's draft at. With confidences
        (after the call they say how far each draft survives) the pooled profile times
        ``RealizedGain.survival_scale``, depth 0 read ``GATE_OPTIMISM`` high: a request's own
        survival dips below break-even by chance and skipped steps where drafting paid. Without (n-gram) the
        request's own survival scales the profile, and no outcome-based scale is added (it learnt
        what the profile and the request already learn: code_edit c=1 gated at 0.15 where 0.34 survived)."""
        if self.drafter.has_confidences:
            optimism = self.GATE_OPTIMISM / max(len(self._decoding), 1)
            return self.depth.rates(num_positions, self.realized.survival_scale, optimism)
        return self.depth.rates(num_positions, self.survival(request).scale)

    def _base_s(self, decoding: list[Request]) -> float:
        """The gate's base: the seconds of the plain step of ``decoding`` (the requests that
        decode; priced, or measured: ``GateSchedule.plain_s``). The coming step's is priced once."""
        if decoding is self._decoding and self._step_base_s is not None:
            return self._step_base_s
        priced_s = self.prices.decodes_s([(r, 1) for r in decoding])
        measured_s = self.schedule.plain_s(len(decoding), priced_s)
        base_s = priced_s if measured_s is None else measured_s
        if decoding is self._decoding:
            self._step_base_s = base_s
        return base_s

    def _plan(self, decoding, drafting, confidences, draft_s: float = 0.0, min_gain: float = 0.0,
              draft_s_per_position: float = 0.0, draft_s_per_request: float = 0.0) -> DraftPlan:
        # beside prefill chunks a drafted position costs one more token at the whole step's size
        # (in a full step it displaces a chunk token), and the chunks commit nothing of the decodes'
        return choose_draft_plan(confidences, committed_base=len(decoding),
                                 tokens_base=len(decoding) + self._prefill_tokens,
                                 costs=self.step_costs, draft_s=draft_s, min_gain=min_gain,
                                 draft_s_per_position=draft_s_per_position, draft_s_per_request=draft_s_per_request,
                                 fetch_s_per_position=[self.prices.fetch_s_per_position(r) for r in drafting],
                                 attend_s_per_position=[self.prices.attend_s_per_position(r) for r in drafting],
                                 base_s=self._base_s(decoding))

    def observe(self, committed: list[tuple[Request, int]], features: torch.Tensor | None,
                first_row: dict[str, int]) -> None:
        """``committed``: (request, its first position committed this step) for the step's
        unfinished requests; ``features``: the step's captured features, where a request's
        committed positions ``start .. request.num_computed_tokens`` occupy rows from
        ``first_row[request_id]`` on. One drafter call for all of them."""
        if features is None:
            return
        self.drafter.observe_batch(features, [(r.request_id, start, first_row[r.request_id], r.num_computed_tokens - start)
                                              for r, start in committed])

    def release(self, request: Request) -> None:
        self._confidences.pop(request.request_id, None)
        self._cut.pop(request.request_id, None)
        self.drafter.release(request.request_id)
