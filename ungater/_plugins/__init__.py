"""The plugin seam: the hook specifications, plugin discovery, and binding configured kinds.

Pure apart from reading entry points at start-up. Plugins see only ``ungater.plugin_api``;
the core sees plugins only through the registry's wrapped calls.
"""
