"""Large-batch optimizers for Keras 3: LARS and LAMB, and their usual exclusions.

Importing this package registers `tfdist>LARS`, `tfdist>LAMB` and the schedule
`tfdist>WarmupDecay`, so a `model.keras` saved with them loads back by name.
"""

from tfdist.optimizers import schedules as _schedules  # noqa: F401  (registers WarmupDecay)
from tfdist.optimizers.exclusions import usual_exclusions
from tfdist.optimizers.lamb import LAMB
from tfdist.optimizers.lars import LARS

__all__ = ["LAMB", "LARS", "usual_exclusions"]
