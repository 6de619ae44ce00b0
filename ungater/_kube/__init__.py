"""Talking to the API server: the client seam and its kubernetes-asyncio adapter, list-watch
reflectors, Lease leader election, where Kueue's API lives, and the look at admission policies
that tells whether our gate is guarded.

The only folder below the controller that does network I/O; it knows nothing of decisions.
"""
