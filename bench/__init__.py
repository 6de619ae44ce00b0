"""Benchmarks of ungater on the real local control plane: ``python -m bench run [--quick]``.

Not part of the test suite. The harness starts (or reuses) the local kube-apiserver, etcd and
kube-controller-manager, runs the controller as a separate process exactly as a user would
(``python -m ungater run``), plays Kueue's part on Workload slices, watches the pods itself
and reports medians and 95th percentiles as a table and as JSON. See docs/benchmarks.md.
"""
