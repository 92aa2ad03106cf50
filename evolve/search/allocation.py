"""How the cores are shared between the LLM and tuning of the archive (`search.tuning.background`).

They take turns. With `tuning.adaptive`, tuning's share of the next cycle follows where the
best objective rose faster per second of turn: tuning climbs fast on a new structure and then
stalls; the LLM rarely finds a structure, but is all that can leave a tuned plateau. Old cycles
fade (`DECAY`), and each operator keeps a floor so that it can show it has started paying off.

What an operator shows in the last few cycles is weighed against what it has made over the whole
run: when both are flat, the share leans toward the one that has paid more per second so far
instead of going back to half and half. (Measured: on a plateau lasting half an hour the share
sat at 0.48-0.52 while tuning had raised the best 68 times in 85 tunings and the LLM's own
children 23 times in 142, and tuning alone reached the next basin three times sooner.)

But the run-long record starves the LLM exactly when only it can help: tuning climbs the seed's
structure in the first minutes, earns a record the LLM cannot match, and then holds the high bound
on a plateau it cannot leave. (Measured: seed 5, tuning at the seed shape's ceiling by minute 7,
then 80 % of the time for 23 minutes, 10 LLM calls in the half hour; the run ended at n26 2.46.)
So once tuning has raised nothing for PLATEAU_CYCLES cycles in a row, its share is capped at
`plateau_share` until it raises the best again: the LLM keeps enough calls to find a new structure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.5  # the weight of a cycle one cycle later: a plateau is seen within a few cycles
# What an operator is assumed to make before it has shown anything: 1e-3 of objective a minute.
PRIOR_GAIN, PRIOR_S = 1e-3, 60.0
# A cycle's rise below this is not progress (a tuned plateau creeping up): it counts as none.
MIN_GAIN = 1e-4
OPERATORS = ("llm", "tuning")
PLATEAU_CYCLES = 3  # tuning flat this many cycles in a row: it has climbed what it can


def _zeros() -> dict[str, float]:
    return dict.fromkeys(OPERATORS, 0.0)


@dataclass
class Allocation:
    share: float  # tuning's share of the next cycle
    adaptive: bool = False
    low: float = 0.2
    high: float = 0.8
    plateau_share: float = 1.0  # tuning's most on its plateau (1: no cap)
    flat: int = 0  # cycles in a row in which tuning raised nothing
    gains: dict[str, float] = field(default_factory=_zeros)  # fading with DECAY per cycle
    seconds: dict[str, float] = field(default_factory=_zeros)
    total_gain: dict[str, float] = field(default_factory=_zeros)  # the whole run's
    total_s: dict[str, float] = field(default_factory=_zeros)

    def record(self, gain: dict[str, float], seconds: dict[str, float]) -> float:
        """One cycle's rise of the best objective and seconds per operator; the next share."""
        if not self.adaptive:
            return self.share
        for op in OPERATORS:
            g, s = gain.get(op, 0.0), seconds.get(op, 0.0)
            g = g if g >= MIN_GAIN else 0.0
            self.gains[op] = DECAY * self.gains[op] + g
            self.seconds[op] = DECAY * self.seconds[op] + s
            self.total_gain[op] += g
            self.total_s[op] += s
        self.flat = self.flat + 1 if gain.get("tuning", 0.0) < MIN_GAIN else 0
        rate = {op: self.rate(op) for op in OPERATORS}
        high = min(self.high, self.plateau_share) if self.flat >= PLATEAU_CYCLES else self.high
        self.share = min(high, max(self.low, rate["tuning"] / (rate["tuning"] + rate["llm"])))
        return self.share

    def rate(self, op: str) -> float:
        """Recent gain per second, shrunk toward the run-long rate (itself shrunk toward the
        prior): recent cycles decide while they show something, the run's record when not."""
        long_run = (self.total_gain[op] + PRIOR_GAIN) / (self.total_s[op] + PRIOR_S)
        return (self.gains[op] + long_run * PRIOR_S) / (self.seconds[op] + PRIOR_S)
