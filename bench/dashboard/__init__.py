"""The dashboard picture in docs/: real metrics, Prometheus's engine, headless Chromium."""
