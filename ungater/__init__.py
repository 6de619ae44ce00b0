"""ungater: releases the gated pods of Kueue elastic jobs, exactly as far as admitted.

The public surface is small: the config model, the decision function and its data types.
Plugin authors import ``ungater.plugin_api`` only; names here load lazily so that importing the
plugin API does not pull in pydantic and YAML.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "ungater.config",
    "ConfigError": "ungater.config",
    "load_config": "ungater.config",
    "Decision": "ungater.decision",
    "Ownership": "ungater.decision",
    "PodFacts": "ungater.decision",
    "PodSetReport": "ungater.decision",
    "Release": "ungater.decision",
    "decide": "ungater.decision",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ungater' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
