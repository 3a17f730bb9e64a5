"""`HypertuneCallback`: reports a metric from the epoch logs to Vertex AI tuning (`tfdist.outputs.hypertune`)."""

from typing import Any, Mapping

import keras

from tfdist.errors import UsageError
from tfdist.outputs.hypertune import MetricReporter

__all__ = ["HypertuneCallback"]


class HypertuneCallback(keras.callbacks.Callback):
    """Reports `metric` from the epoch logs to Vertex AI tuning, on the chief.

    Keras evaluates the validation data at the end of an epoch, so each
    epoch end with `metric` in its logs is one report, tagged `metric`
    (give the same name as the tuning job's `metricId`), at the
    optimizer's step count. Epochs without validation (`validation_freq`)
    are skipped; a metric that is in no log is a usage error naming the
    ones that are, and so is a `val_*` metric when training ends without
    a single validation (Vertex AI would see a trial that reported nothing).

    Args:
        metric: Log key to report, e.g. `val_accuracy` or `val_loss`.
        is_chief: Only the chief reports; other replicas do nothing.
        reporter: Where to write; default a `MetricReporter()`.
    """

    def __init__(self, metric: str, *, is_chief: bool, reporter: MetricReporter | None = None):
        super().__init__()
        if not metric or not isinstance(metric, str):
            raise UsageError(
                f"--hparam_metric is {str(metric)[:100]!r}, expected a "
                f"metric name from the epoch logs such as val_accuracy"
            )
        self.metric = metric
        self.is_chief = bool(is_chief)
        self._reporter = reporter
        self.reports = 0

    @property
    def reporter(self) -> MetricReporter:
        if self._reporter is None:
            self._reporter = MetricReporter()
        return self._reporter

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None):
        if not self.is_chief:
            return
        logs = logs or {}
        if self.metric not in logs:
            validated = any(key.startswith("val_") for key in logs)
            if self.metric.startswith("val_") and not validated:
                return  # no validation this epoch
            raise UsageError(
                f"--hparam_metric={self.metric[:100]} is not in the epoch "
                f"logs, expected one of: {', '.join(sorted(logs))}"
            )
        step = int(self.model.optimizer.iterations.numpy()) if self.model is not None else epoch + 1
        self.reporter.report(self.metric, float(logs[self.metric]), step)
        self.reports += 1

    def on_train_end(self, logs: Mapping[str, Any] | None = None):
        if self.is_chief and not self.reports:
            raise UsageError(
                f"--hparam_metric={self.metric[:100]} was never reported: no "
                f"epoch ran a validation; expected validation data (e.g. "
                f"--validation_steps > 0) or a training metric such as loss"
            )
