"""ungater: releases the gated pods of Kueue elastic jobs, exactly as far as admitted.

The public surface is this package's names (the config model and the pure decision), the
plugin API (``ungater.plugin_api``) and the plugin author's test kit (``ungater.testing``).
Every module whose name starts with an underscore is internal and may change in any release.
Names here load lazily so that importing the plugin API does not pull in pydantic and YAML.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "ungater._model.config",
    "ConfigError": "ungater._cli.configfile",
    "load_config": "ungater._cli.configfile",
    "Decision": "ungater._decide.decision",
    "Ownership": "ungater._decide.decision",
    "PodFacts": "ungater._decide.decision",
    "PodSetReport": "ungater._decide.decision",
    "Release": "ungater._decide.decision",
    "decide": "ungater._decide.decision",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ungater' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
