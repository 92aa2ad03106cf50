"""How the cores are shared between the LLM and tuning of the archive (`search.tuning.background`).

They take turns. With `tuning.adaptive`, tuning's share of the next cycle follows where the
best objective rose faster per second of turn: tuning climbs fast on a new structure and then
stalls; the LLM rarely finds a structure, but is all that can leave a tuned plateau. Old cycles
fade (`DECAY`), and each operator keeps a floor so that it can show it has started paying off.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.5  # the weight of a cycle one cycle later: a plateau is seen within a few cycles
# What an operator is assumed to make before it has shown anything: 1e-3 of objective a minute.
# Gains far below it (a tuned plateau creeping up) do not move the share.
PRIOR_GAIN, PRIOR_S = 1e-3, 60.0
OPERATORS = ("llm", "tuning")


@dataclass
class Allocation:
    share: float  # tuning's share of the next cycle
    adaptive: bool = False
    low: float = 0.2
    high: float = 0.8
    gains: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OPERATORS, 0.0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OPERATORS, 0.0))

    def record(self, gain: dict[str, float], seconds: dict[str, float]) -> float:
        """One cycle's rise of the best objective and seconds per operator; the next share."""
        if not self.adaptive:
            return self.share
        for op in OPERATORS:
            self.gains[op] = DECAY * self.gains[op] + max(gain.get(op, 0.0), 0.0)
            self.seconds[op] = DECAY * self.seconds[op] + seconds.get(op, 0.0)
        rate = {op: (self.gains[op] + PRIOR_GAIN) / (self.seconds[op] + PRIOR_S) for op in OPERATORS}
        self.share = min(self.high, max(self.low, rate["tuning"] / (rate["tuning"] + rate["llm"])))
        return self.share
