"""ungater: releases the gated pods of Kueue elastic jobs, exactly as far as admitted.

The public surface is small: the config model, the decision function and its data types, the
plugin registry, and the controller. Plugin authors import ``ungater.plugin_api`` only.
"""

from ungater.config import Config, ConfigError, load_config
from ungater.decision import Decision, Ownership, PodFacts, PodSetReport, Release, decide

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigError",
    "Decision",
    "Ownership",
    "PodFacts",
    "PodSetReport",
    "Release",
    "__version__",
    "decide",
    "load_config",
]
