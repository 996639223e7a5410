"""The per-call settings of a sampler call (`Sampler.generate` / `Sampler.extend`)."""
from __future__ import annotations

import dataclasses
import math

MAX_STOP_IDS = 8  # the decode program's stop-id slots: one compiled program for any set


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one call samples. temperature 0 is greedy; top_k 0 and top_p 1 disable truncation
    (log-probs follow the convention of sampling/decode.py either way). Every row emits at most
    `max_new_tokens` tokens and stops after emitting one of `stop_ids` (at most MAX_STOP_IDS).
    Temperature, top-p, top-k and the stop ids are traced values of the decode program;
    max_new_tokens sets its step bucket."""
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            problems.append(f"temperature={self.temperature} must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            problems.append(f"top_k={self.top_k} must be >= 0 (0 = no top-k)")
        if len(self.stop_ids) > MAX_STOP_IDS:
            problems.append(f"stop_ids: at most {MAX_STOP_IDS} stop ids, got {len(self.stop_ids)}")
        if problems:
            raise ValueError("SamplingParams: " + "; ".join(problems))

    def with_budget(self, max_new_tokens: int) -> SamplingParams:
        """The same settings with another token budget (a turn of another length)."""
        return dataclasses.replace(self, max_new_tokens=max_new_tokens)

