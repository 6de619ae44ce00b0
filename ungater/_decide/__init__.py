"""The decision and everything pure it uses: which gated pods to release, and why.

Indexed caches, the per-owner assessment, expectations, refusals, stand-down, audit findings and
the release patch itself. No I/O, no event loop: every input is passed in, including the time,
so each module is tested as a function.
"""
