"""Stop conditions and streamed text of one request: eos / stop ids, stop strings, length.

Text is detokenized incrementally. Streamed text withholds any tail that could still become a
stop string, so a client never sees part of a stop sequence that is later cut.
"""

from __future__ import annotations

from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.model.tokenizer import IncrementalDetokenizer, Tokenizer


class StopChecker:
    def __init__(self, tokenizer: Tokenizer, params: SamplingParams, eos_token_ids: tuple[int, ...]):
        self.params = params
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_ids.update(eos_token_ids)
        self.text = ""  # the output text, cut at a stop string once one is found
        self.num_streamed_chars = 0
        self.stop_string_hit = False

    def append(self, token_id: int) -> str | None:
        """Adds one generated token. Returns "stop" when the request must finish, else None."""
        if token_id in self.stop_ids:
            return "stop"
        self.text += self.detokenizer.push(token_id)
        if self.params.stop:
            search_from = max(0, self.num_streamed_chars - max(len(s) for s in self.params.stop))
            hits = [(self.text.find(s, search_from), s) for s in self.params.stop]
            hits = [(pos, s) for pos, s in hits if pos >= 0]
            if hits:
                pos, stop = min(hits)
                self.text = self.text[: pos + len(stop)] if self.params.include_stop_str_in_output else self.text[:pos]
                self.stop_string_hit = True
                return "stop"
        return None

    def finish(self, reason: str) -> None:
        """Called once when the request ends: emits text the detokenizer still holds back
        (an incomplete UTF-8 sequence at the very end), except after a stop-string cut."""
        if not self.stop_string_hit:
            self.text += self.detokenizer.flush()

    def take_stream_delta(self, finished: bool) -> str:
        """Text not streamed yet; withholds a possible stop-string prefix unless finished."""
        end = len(self.text)
        if not finished and self.params.stop:
            end -= self._held_back_chars()
        end = max(end, self.num_streamed_chars)
        delta = self.text[self.num_streamed_chars : end]
        self.num_streamed_chars = end
        return delta

    def _held_back_chars(self) -> int:
        longest = 0
        for stop in self.params.stop:
            for n in range(min(len(stop) - 1, len(self.text)), 0, -1):
                if self.text.endswith(stop[:n]):
                    longest = max(longest, n)
                    break
        return longest
