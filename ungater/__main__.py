"""``python -m ungater``: the same command line as the ``ungater`` console script."""

from ungater._cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
