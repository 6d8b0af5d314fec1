"""When the adaptive verify budget's gate asks whether drafting pays, and which steps measure the
base it compares drafting against (``engine/speculation.py`` asks it every step).

**Control steps.** Every ``CONTROL_EVERY`` drafting steps in a row, one step drafts nothing, so
the gate's base (the same step without drafts) is measured, not only inferred from the step
table. Without it the table's speed, moved by the drafting steps' own measurements, priced the
plain 4-token step at 44.2 ms while drafting where plain steps took 40.7 (c=4, DSpark): every
draft looked ~8% better than it was and the drafter ran where it lost (0.91x of no speculation).
A control step's measurement moves its count's shape ``CONTROL_WEIGHT`` of the way at once. None
is due when a drafting step of the streak already ran at the base's padded size: at c=1 a
1-token step runs as 2 rows, so one-token drafts measure its price, and control steps there only
cost drafting steps' gains (14 of 259 steps, ~1.5% of DFlash's throughput).

**Rests.** After ``REST_AFTER`` skipped steps in a row (no draft could pay for the drafter), the
gate asks only every ``REST_EVERY`` steps, and at once when the number of candidates changes;
the steps between are skipped steps all the same (estimates relax, requests' evidence ages,
the plain step is held to the base: ``RealizedGain.observe_plain``).
At c=16, where nothing pays, asking cost 0.29 ms of a 59 ms step (0.5%) for the same answer.
After ``REST_LONG_AFTER`` skipped steps in a row it asks every ``REST_LONG_EVERY`` steps: an
adaptive engine whose gate never drafts must cost next to nothing over no speculation, and every
4th step's plan was still ~0.15% of c=16 sparse chat's decode (the drafter's observation and the
gate's bookkeeping brought the total to ~0.9%, where identical engines read 0.2-0.6% apart).

**Probes.** The first draft after ``REST_AFTER`` skipped steps in a row verifies at most one
token per request: the estimates that let the gate ask again have relaxed (towards their
long-run rates), not been measured, and depth 0 is what they need measured first; a deeper
position then costs a verify row for the product of two guesses. DFlash on code_edit at c=1
(sparse) drafted two tokens in its probes, promised 1.33-1.54 committed tokens and got
1.11-1.13: the second position, tried 14 times, never survived. Capped to one token (lockstep, 3 repeats against no
speculation): 0.974 where 0.956, with 50 drafting steps where 83; chat c=1 dense unchanged or
better (DSpark 1.133 / 1.125, DFlash 1.271 / 1.255). An engine's first drafts are capped alike
while depth 0 has less evidence than its prior (``DepthSurvival.unmeasured``): DFlash's prior
(0.5, from chat) let its first code_edit drafts verify two tokens for 14 steps, 2 of them
surviving; capped, 7 one-token steps learnt the same. Where no one-token draft pays for the
drafter's call, a probe plans the full lengths instead (``Speculator._worth_the_drafter``): a
probe capped at one token then never drafts. DSpark at dense chat c=4 (a 15 ms call on a 65 ms
step) skipped 202 of 275 asks at 4 requests, 99 of them such probes, where fixed two-token drafts
ran 1.07x of the plain steps; planned at full length (lockstep, 3 repeats): 1.063x of no
speculation where 1.054x (fixed k=2 1.089x), 259 drafting steps where 178; DFlash 1.084x / 1.083x.

**The measured base.** The step table is profiled on one request and corrected by the steps it
measures, in batch tokens alone; what a step costs per request (its sampling, its bookkeeping,
attention's fixed part) is folded into it at whatever request counts ran. At c=16 chat, after
the table had learnt from 16-request steps, it priced the plain 10-request step of a decode's tail
at 55-63 ms where those steps took 50-51 (lockstep, DFlash): every draft there looked 10-20%
better than it was, and the tail's drafting steps, promised x1.1-1.3, cost the decode 2-4%. So
each plain step (every request decoding, no drafts: the steps the gate skips, and control steps)
is kept per request count (``PLAIN_WEIGHT`` moving average), and the gate prices its base at it.
A measured base above the table's price of the same step is not trusted over it: kept in
seconds, the base stayed at a slow spell's when the gate then drafted and no plain step came to
correct it (c=16 sparse chat: plain 16-request steps took 70 ms; a spell of 90-150 ms steps, in
every engine of the lockstep run, lifted the kept base to 107 ms and the gate drafted at a
promised x1.1 where its steps ran at 0.8 of the base: 0.935 of no speculation), and kept at the
machine speed of its measurement instead, it rose with that speed, which drafting steps raise
too (dense c=16: 0.96-0.98 where the seconds base read 1.00). The table follows the machine,
and a base priced low only makes drafting look worse, but not by much: ``PLAIN_ABOVE_PRICE``.
A one-token step runs its GEMMs as two rows, so the table prices it at what one-token drafts'
two-token steps measure, and its own decode path took 0.7-1 ms more (c=1: 27.0 ms against 26.0-26.3
priced). Capped at the price, the base was 3-4% low, and with the minimum gain the gate asked
drafts for 6% where one-token DSpark drafts paid 8% (code_edit) and drafted on half the steps. A measurement also counts as at most
``PLAIN_MAX_JUMP`` off the figure it updates (one preempted step is not a base).

**The bar at many requests.** A draft must promise ``Speculator.MIN_GAIN`` more throughput than
none, plus ``MIN_GAIN_PER_REQUEST`` for each request decoding beyond the first
(``extra_gain``): 2% alone, 14% at 16. With many requests a step's drafts promise a few percent
on a large base (chat, c=16: 1.02-1.16 over a 60-100 ms plain step), and the promise holds errors
that a lone request's does not. The gate drafts where its base reads high, and a base measured in
a slow spell is high (5-9% above the plain steps that followed the drafting steps); requests that
drafts carry ahead finish early, and at a decode's end the rest run in small steps. In lockstep
traces (dense chat, c=16, 3 rounds, the trailing none as A/A) DSpark's drafting steps promised
1.09 and delivered 1.01 of the next plain steps, and adaptive engines read 0.97-0.99 of none. At
4 requests the bar is 4.4%: 1% of DFlash's drafting steps at chat c=4 promised less.

**Optimism.** For a drafter with confidences the gate reads depth 0's survival
``Speculator.GATE_OPTIMISM`` standard errors above the pooled estimate
(``DepthSurvival.first_error``), divided by the requests decoding. The drafter's call is the price
of the only evidence there is, and a point estimate from few trials shut it off for good: DFlash
on code_edit at c=1, where one-token drafts survive 0.19 over the text but 1 of the first 12 did,
fell below the bar, then probed every ~20 steps, each failure taking 0.015 off, and sat out most
of 4 decodes at ~0.14. The error widens as skipped steps relax the counts, so a probe comes
sooner when little vouches for the estimate. At one request (lockstep, 6 repeats, medians over
none): dense 1.015x where 1.003x (fixed one-token drafts 1.040x), drafting on 531 of 676 steps
where 196; sparse 1.020x where 1.000x (fixed 1.035x); chat c=1 and c=4 unchanged within the
repeats. With many requests a step brings many trials at once and the bar holds the noise of
large promises: read at a full standard error, sparse chat c=16 drafted on 30 of 380 steps
(probes as the error widened, decodes' tails) where it never did, and read 0.95-0.99x of none;
at 1/16 of one it never drafted.
"""

from __future__ import annotations


class GateSchedule:
    CONTROL_EVERY = 16
    CONTROL_WEIGHT = 0.5
    REST_AFTER = 8
    REST_EVERY = 4
    REST_LONG_AFTER = 64
    REST_LONG_EVERY = 16
    PLAIN_WEIGHT = 0.2  # of the newest plain step in its request count's moving average
    PLAIN_MAX_JUMP = 1.25  # a plain step counts as at most this factor off its count's figure
    PLAIN_ABOVE_PRICE = 1.05  # the measured base is trusted up to this factor above the table's price
    MIN_GAIN_PER_REQUEST = 0.008  # of throughput a draft must promise per request decoding beyond one

    def __init__(self):
        self.drafting_streak = 0  # drafting steps in a row since the last step without drafts
        self.skipped_streak = 0  # skipped steps in a row
        self.num_control_steps = 0
        self.num_skipped_steps = 0  # steps with candidates where no draft could pay for the drafter
        self._streak_sizes: set[int] = set()  # padded batch tokens the streak's drafting steps ran at
        self._asked_candidates = 0  # candidates when the gate last asked
        self._plain_s: dict[int, float] = {}  # requests -> measured seconds of a plain step
        # what the steps it skips owe until it next asks (``Speculator._catch_up``): their
        # relaxing, the measurements of the steps it sat out (in order), and the base it priced
        self.unrelaxed = 0
        self.unmeasured: list[tuple] = []
        self.asked_base = (-1, 0.0)  # (decoding requests, seconds) when it last asked and skipped

    def measured_plain_step(self, num_requests: int, seconds: float) -> None:
        """A step in which ``num_requests`` requests decoded one token each, no drafts, took ``seconds``."""
        if seconds <= 0:
            raise ValueError(f"a plain step's duration must be positive, not {seconds}")
        old = self._plain_s.get(num_requests)
        if old is None:
            self._plain_s[num_requests] = seconds
            return
        seconds = min(max(seconds, old / self.PLAIN_MAX_JUMP), old * self.PLAIN_MAX_JUMP)
        self._plain_s[num_requests] = old + self.PLAIN_WEIGHT * (seconds - old)

    def plain_s(self, num_requests: int, priced_s: float) -> float | None:
        """The seconds of a plain step of ``num_requests`` requests: the measured figure, at most
        ``PLAIN_ABOVE_PRICE`` x ``priced_s`` (the table's price of it now); None: none measured."""
        measured = self._plain_s.get(num_requests)
        return None if measured is None else min(measured, priced_s * self.PLAIN_ABOVE_PRICE)

    def extra_gain(self, num_decoding: int) -> float:
        """What a draft must promise beyond ``Speculator.MIN_GAIN`` with ``num_decoding`` requests decoding."""
        return self.MIN_GAIN_PER_REQUEST * max(num_decoding - 1, 0)

    def control_due(self, padded_base: int) -> bool:
        """Whether the coming step (every running request decoding, its batch tokens without
        drafts padded to ``padded_base``) is a control step; counts it if so."""
        due = self.drafting_streak >= self.CONTROL_EVERY and padded_base not in self._streak_sizes
        self.num_control_steps += due
        return due

    def rests(self, num_candidates: int) -> bool:
        """Whether the gate sits the coming step out; otherwise it asks now."""
        every = self.REST_LONG_EVERY if self.skipped_streak >= self.REST_LONG_AFTER else self.REST_EVERY
        resting = (self.after_skipped_run and self.skipped_streak % every != 0
                   and num_candidates == self._asked_candidates)
        if not resting:
            self._asked_candidates = num_candidates
        return resting

    @property
    def after_skipped_run(self) -> bool:
        """At least ``REST_AFTER`` skipped steps in a row: the gate rests, and its next draft is a probe."""
        return self.skipped_streak >= self.REST_AFTER

    def probe_lengths(self, max_tokens: list[int], unmeasured: bool = False) -> list[int]:
        """The draft lengths the gate plans first now: ``max_tokens``, or 1 each in a probe and
        while depth 0 is ``unmeasured`` (``DepthSurvival.unmeasured``: an engine's first drafts)."""
        return [min(n, 1) for n in max_tokens] if self.after_skipped_run or unmeasured else max_tokens

    def skipped(self) -> None:
        """The coming step has candidates, and no draft could pay for the drafter."""
        self.num_skipped_steps += 1
        self.skipped_streak += 1
        self.unrelaxed += 1

    def proposed(self, drafting: bool) -> None:
        """The coming step's proposal is made: the drafter ran (``drafting``) or not."""
        if drafting:
            self.drafting_streak += 1
            self.skipped_streak = 0
        else:
            self.drafting_streak = 0
            self._streak_sizes.clear()

    def measured_drafting_step(self, padded_tokens: int) -> None:
        """A step whose drafter ran took its target pass at ``padded_tokens`` (padded batch tokens)."""
        self._streak_sizes.add(padded_tokens)
