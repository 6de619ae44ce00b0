"""The running controller: the manager composes caches, leader election, the probe server and
the recorder around one controller, which owns the work queue, the watch handlers, the
reconciler, the patcher (the only place a gate is removed) and the shared state.

The one folder that joins I/O to decisions; it imports from every folder below it.
"""
