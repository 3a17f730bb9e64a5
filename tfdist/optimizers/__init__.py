"""Large-batch optimizers for Keras 3: LARS and LAMB, and their usual exclusions."""

from tfdist.optimizers.exclusions import usual_exclusions
from tfdist.optimizers.lamb import LAMB
from tfdist.optimizers.lars import LARS

__all__ = ["LAMB", "LARS", "usual_exclusions"]
