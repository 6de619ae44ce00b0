"""The command line: ``ungater run|check-config|plugins|explain|audit``, the config file loader
and the kubectl plugin.

The top layer: reads files, arguments and the environment, and calls the layers below.
"""
