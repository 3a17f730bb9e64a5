"""Learning rates for large batches: scaling by global batch, warmup, then decay."""

import math
from typing import Sequence

import keras
from keras import ops

from tfdist.errors import UsageError
from tfdist.optimizers.choice import DECAYS, SCALING_RULES

__all__ = ["scale_learning_rate", "WarmupDecay"]


def scale_learning_rate(
    base_learning_rate: float, *, rule: str, global_batch_size: int, reference_batch_size: int
) -> float:
    """Scales a learning rate tuned at `reference_batch_size` to the global batch.

    `linear` multiplies it by `global_batch_size / reference_batch_size` (Goyal
    et al., 2017), `sqrt` by the square root of that (the usual rule for Adam
    and LAMB), `none` leaves it.

    Raises:
        UsageError: Unknown rule, or a batch size that is not positive.
    """
    if rule not in SCALING_RULES:
        raise UsageError(
            f"learning-rate scaling rule is {rule!r}, expected one of: {', '.join(SCALING_RULES)}"
        )
    if rule == "none":
        return float(base_learning_rate)
    for name, value in (
        ("global_batch_size", global_batch_size),
        ("reference_batch_size", reference_batch_size),
    ):
        if not value > 0:
            raise UsageError(
                f"{name} is {value!r}, expected a positive batch size to "
                f"scale the learning rate by rule {rule!r}"
            )
    factor = global_batch_size / reference_batch_size
    if rule == "sqrt":
        factor = math.sqrt(factor)
    return float(base_learning_rate) * factor


@keras.saving.register_keras_serializable(package="tfdist")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to a peak learning rate, then a decay over the remaining steps.

    With `s` the 0-based step (the optimizer's `iterations`), `W` the warmup
    steps and `D = total_steps - W` the decay steps:

    - `s < W`: `lr = peak · (s + 1) / W` (the last warmup step reaches the peak);
    - otherwise, with progress `p = min((s − W) / D, 1)`:
      - `constant`: `peak`;
      - `cosine`: `end + (peak − end) · (1 + cos(π·p)) / 2`;
      - `polynomial`: `end + (peak − end) · (1 − p)^power`;
      - `step`: `peak · decay_rate^k`, `k` the number of `boundaries` ≤ `p`.
        Boundaries are FRACTIONS of the decay phase in (0, 1), increasing:
        `(0.5, 0.75)` decays at half and three quarters of the post-warmup steps.

    Args:
        peak_learning_rate: The rate reached at the end of warmup.
        total_steps: Planned optimizer updates, warmup included.
        warmup_steps: Linear warmup length, 0 for none.
        decay: One of `constant`, `cosine`, `polynomial`, `step`.
        end_learning_rate: Final rate for `cosine` and `polynomial`.
        power: Exponent of `polynomial`.
        boundaries: Decay points of `step`, as fractions of the decay phase.
        decay_rate: Multiplier applied at each `step` boundary.
        name: Optional name.
    """

    def __init__(
        self,
        peak_learning_rate: float,
        *,
        total_steps: int,
        warmup_steps: int = 0,
        decay: str = "constant",
        end_learning_rate: float = 0.0,
        power: float = 1.0,
        boundaries: Sequence[float] = (),
        decay_rate: float = 0.1,
        name: str | None = None,
    ):
        if not peak_learning_rate > 0:
            raise UsageError(f"peak learning rate is {peak_learning_rate!r}, expected a number > 0")
        if not (isinstance(total_steps, int) and total_steps > 0):
            raise UsageError(
                f"total_steps is {total_steps!r}, expected a positive number of optimizer updates"
            )
        if not (isinstance(warmup_steps, int) and 0 <= warmup_steps <= total_steps):
            raise UsageError(
                f"warmup_steps is {warmup_steps!r}, expected an integer "
                f"from 0 to total_steps ({total_steps}); shorten the warmup "
                f"or train longer"
            )
        if decay not in DECAYS:
            raise UsageError(f"decay is {decay!r}, expected one of: {', '.join(DECAYS)}")
        if not 0 <= end_learning_rate <= peak_learning_rate:
            raise UsageError(
                f"end_learning_rate is {end_learning_rate!r}, expected a "
                f"number from 0 to the peak ({peak_learning_rate})"
            )
        if decay == "polynomial" and not power > 0:
            raise UsageError(f"power is {power!r}, expected a number > 0 for polynomial decay")
        boundaries = tuple(float(b) for b in boundaries)
        if decay == "step":
            _check_boundaries(boundaries)
            if not 0 < decay_rate <= 1:
                raise UsageError(
                    f"decay_rate is {decay_rate!r}, expected a number in (0, 1] for step decay"
                )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)
        self.boundaries = boundaries
        self.decay_rate = float(decay_rate)
        self.name = name

    @property
    def decay_steps(self) -> int:
        return self.total_steps - self.warmup_steps

    def __call__(self, step):
        step = ops.cast(step, "float32")
        progress = ops.clip((step - self.warmup_steps) / max(self.decay_steps, 1), 0.0, 1.0)
        decayed = self._decayed(progress)
        if not self.warmup_steps:
            return decayed
        warming = self.peak_learning_rate * (step + 1.0) / self.warmup_steps
        return ops.where(step < self.warmup_steps, warming, decayed)

    def _decayed(self, progress):
        peak, end = self.peak_learning_rate, self.end_learning_rate
        if self.decay == "cosine":
            return end + (peak - end) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        if self.decay == "polynomial":
            return end + (peak - end) * ops.power(1.0 - progress, self.power)
        if self.decay == "step":
            passed = sum(ops.cast(progress >= b, "float32") for b in self.boundaries)
            return peak * ops.power(self.decay_rate, passed)
        return ops.full_like(progress, peak)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
            "boundaries": list(self.boundaries),
            "decay_rate": self.decay_rate,
            "name": self.name,
        }


def _check_boundaries(boundaries: tuple[float, ...]) -> None:
    if not boundaries:
        raise UsageError(
            "step decay has no boundaries, expected fractions of the decay "
            "phase such as 0.5,0.75; set them or choose another decay"
        )
    in_range = all(0 < b < 1 for b in boundaries)
    increasing = all(a < b for a, b in zip(boundaries, boundaries[1:]))
    if not (in_range and increasing):
        raise UsageError(
            f"step decay boundaries are {list(boundaries)}, expected "
            f"increasing fractions of the decay phase in (0, 1), e.g. 0.5,0.75"
        )
