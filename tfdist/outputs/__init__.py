"""What a run leaves for others: the SavedModel export, checkpoints for a sidecar evaluator
and the evaluator itself, hyperparameter-tuning reports. See docs/architecture.md.
"""

__all__ = []
