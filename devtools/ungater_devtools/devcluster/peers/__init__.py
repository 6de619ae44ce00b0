"""The real peers on the local plane: Kueue, the KubeRay operator and the JobSet controller.
``render`` turns their kustomized manifests into objects (pure); ``runner`` installs those on
a running plane and starts and waits for each peer.  The peers use the plane; the plane never
uses them (an import-linter contract)."""
