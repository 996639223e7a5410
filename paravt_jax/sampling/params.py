"""The per-call settings of a sampler call (`Sampler.generate` / `Sampler.extend`)."""
from __future__ import annotations

import dataclasses
import math
import numbers

from paravt_jax.config import ConfigValueError, Rule, checked, validate

MAX_STOP_IDS = 8  # the decode program's stop-id slots: one compiled program for any set


def _integer(value) -> bool:  # numpy integers too: budgets are computed from array lengths
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


TOKENS = Rule("an integer >= 1", lambda v: _integer(v) and v >= 1)
TEMPERATURE = Rule("a finite number >= 0", lambda v: _finite(v) and v >= 0)
TOP_P = Rule("a number in (0, 1]", lambda v: _finite(v) and 0 < v <= 1)
TOP_K = Rule("an integer >= 0 (0 = no top-k)", lambda v: _integer(v) and v >= 0)
STOP_IDS = Rule(f"at most {MAX_STOP_IDS} stop ids", lambda v: len(v) <= MAX_STOP_IDS)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one call samples. temperature 0 is greedy; top_k 0 and top_p 1 disable truncation
    (log-probs follow the convention of sampling/decode.py either way). Every row emits at most
    `max_new_tokens` tokens and stops after emitting one of `stop_ids` (at most MAX_STOP_IDS).
    Temperature, top-p, top-k and the stop ids are traced values of the decode program;
    max_new_tokens sets its step bucket. A bad value is refused naming the field
    (`SamplingParams.top_p=1.5: must be a number in (0, 1]`)."""
    max_new_tokens: int = checked(256, TOKENS)
    temperature: float = checked(0.0, TEMPERATURE)
    top_p: float = checked(1.0, TOP_P)
    top_k: int = checked(0, TOP_K)
    stop_ids: tuple[int, ...] = checked((), STOP_IDS)

    def __post_init__(self):
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        try:
            validate(self)
        except ConfigValueError as e:
            raise e.within("SamplingParams") from None

    @property
    def truncates(self) -> bool:
        """Whether sampling cuts the distribution (top-k or top-p): the decode program holds the
        truncation branch only for such calls (DecodePlan.truncation)."""
        return self.top_k > 0 or self.top_p < 1.0

    def with_budget(self, max_new_tokens: int) -> SamplingParams:
        """The same settings with another token budget (a turn of another length)."""
        return dataclasses.replace(self, max_new_tokens=max_new_tokens)
