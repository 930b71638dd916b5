"""Incremental detokenization and stop strings, per request."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns generated ids into text deltas, never splitting a UTF-8 character, and holds back
    text that might be the start of a stop string so it is never emitted."""

    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.max_stop_len = max((len(s) for s in stop), default=0)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all decoded text so far
        self.num_emitted = 0  # characters of `text` already handed out
        self.stopped = False

    def add(self, token_id: int) -> bool:
        """Add one generated token; return True if a stop string ended the text."""
        self.ids.append(token_id)
        before = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return False
        new_start = len(self.text)
        self.text += after[len(before) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        if self.stop:
            search_from = max(0, new_start - self.max_stop_len + 1)
            hits = [i for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return True
        return False

    def flush(self, finished: bool) -> str:
        """The text not yet emitted that is safe to emit now (all of it when finished)."""
        if finished and not self.stopped and self.read_offset < len(self.ids):
            before = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
            self.text += self.tokenizer.decode(self.ids[self.prefix_offset :])[len(before) :]
            self.read_offset = len(self.ids)
        end = len(self.text)
        if not finished and self.stop:
            end -= self._held_back()
        delta = self.text[self.num_emitted : end]
        self.num_emitted = max(self.num_emitted, end)
        return delta

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        for n in range(min(self.max_stop_len - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
