"""The built-in ungater plugins: batch/v1 Job, JobSet and RayCluster.

Installed as the package ``ungater_plugins`` and found through the ``ungater.plugins`` entry
point group, exactly like a third-party plugin; the core has no special path for them. Each
module serves one owner kind, imports only ``ungater.plugin_api`` and stays independent of its
siblings, so any one of them can be disabled (``UNGATER_PLUGINS``) or replaced on its own.
"""
