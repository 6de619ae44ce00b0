"""What the process tells the outside: Prometheus metrics and the collector, Kubernetes Events,
the in-controller auditor, log set-up, and the probe and metrics HTTP endpoint.

Fed by the controller; never decides anything and never releases a pod.
"""
