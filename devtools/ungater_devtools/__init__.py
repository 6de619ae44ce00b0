"""ungater's development tools, a distribution of their own so that the runtime ships none of it.

:mod:`.devcluster` builds and runs a local control plane with the real peers, :mod:`.demo`
narrates an elastic job on it, :mod:`.pytest_plugin` offers it to test suites, and
:mod:`.commands` adds ``dev-cluster`` and ``demo`` to the ``ungater`` command line.
"""
