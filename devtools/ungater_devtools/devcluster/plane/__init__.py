"""The bare local control plane: etcd, kube-apiserver and kube-controller-manager on loopback,
one module per component (``etcd``, ``apiserver``, ``controllermanager``), the admin's HTTP
access (``admin``) and the plane that starts, waits for and stops them (``plane``).  It knows
nothing about what runs on it: CRDs and the peers are installed by
:mod:`ungater_devtools.devcluster.environment` once the plane is up (an import-linter contract
keeps the peers out of this folder)."""
