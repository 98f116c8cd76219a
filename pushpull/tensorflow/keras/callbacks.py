"""``pushpull.tensorflow.keras.callbacks``: the callbacks of :mod:`pushpull.keras.callbacks`."""
from pushpull.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback, LearningRateWarmupCallback, MetricAverageCallback,
)
