"""``kubectl-ungater``: the kubectl plugin (``kubectl ungater explain|audit|plugins``).

kubectl runs any ``kubectl-<name>`` executable on ``PATH`` for ``kubectl <name> ...`` and hands
it the rest of the command line unparsed, so this module speaks kubectl's conventions itself:
``-n/--namespace`` (default: the namespace of the kubeconfig context, else ``default``),
``-A/--all-namespaces``, ``--context`` and ``--kubeconfig`` (default ``$KUBECONFIG``, a
path list, else ``~/.kube/config``). It only translates: the work is done by the ``ungater``
commands of the same names, with the same output and exit codes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["context_namespace", "kubeconfig_paths", "main", "translate"]

PROG = "kubectl ungater"


def kubeconfig_paths(flag: str | None, environ: Mapping[str, str]) -> list[Path]:
    """The kubeconfig files kubectl would read: the flag, else ``$KUBECONFIG`` (a list joined
    by the OS path separator), else ``~/.kube/config``."""
    if flag:
        return [Path(flag)]
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return [Path(p) for p in listed]
    return [Path(environ.get("HOME", str(Path.home()))) / ".kube" / "config"]


def context_namespace(documents: Sequence[Mapping[str, Any]], context: str | None) -> str:
    """The namespace of ``context`` (else of the current context) in merged kubeconfig files:
    as kubectl merges them, the first file that sets a value wins."""
    current = context or next(
        (str(d["current-context"]) for d in documents if d.get("current-context")), ""
    )
    for doc in documents:
        for entry in doc.get("contexts") or ():
            if isinstance(entry, Mapping) and entry.get("name") == current:
                return str((entry.get("context") or {}).get("namespace") or "default")
    return "default"


def _read(paths: Sequence[Path]) -> list[dict[str, Any]]:
    docs = []
    for path in paths:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # kubectl skips missing files of a list; the client reports bad ones
        if isinstance(loaded, dict):
            docs.append(loaded)
    return docs


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="namespace; default: the context's")
    common.add_argument("--context", help="kubeconfig context; default: the current one")
    common.add_argument(
        "--kubeconfig", help="kubeconfig file; default: $KUBECONFIG, ~/.kube/config"
    )
    common.add_argument("-c", "--config", help="ungater config file (its gate and kinds)")
    common.add_argument("--json", action="store_true", help="JSON output")
    p = argparse.ArgumentParser(prog=PROG, description="ungater for kubectl users.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    explain = sub.add_parser(
        "explain", parents=[common], help="why each pod of a workload is (not) released"
    )
    explain.add_argument("workload", metavar="[NAMESPACE/]WORKLOAD")
    audit = sub.add_parser(
        "audit", parents=[common], help="compare what Kueue admitted with what is released"
    )
    audit.add_argument("-A", "--all-namespaces", action="store_true")
    audit.add_argument("--exit-zero", action="store_true", help="exit 0 even on warnings")
    plugins = sub.add_parser("plugins", help="the installed plugins and the kinds they serve")
    plugins.add_argument("--json", action="store_true")
    sub.add_parser("version", help="print the version")
    return p


def _cluster_flags(args: argparse.Namespace) -> list[str]:
    out = []
    if args.kubeconfig:
        out += ["--kubeconfig", args.kubeconfig]
    if args.context:
        out += ["--context", args.context]
    if args.config:
        out += ["--config", args.config]
    if args.json:
        out.append("--json")
    return out


def translate(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The ``ungater`` command line for a ``kubectl ungater`` one (exits 2 on a bad one)."""
    parser = _parser()
    args = parser.parse_args(list(argv))
    if args.command is None:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    if args.command == "version":
        return ["--version"]
    if args.command == "plugins":
        return ["plugins", *(["--json"] if args.json else [])]

    def namespace() -> str:
        if args.namespace:
            return str(args.namespace)
        docs = _read(kubeconfig_paths(args.kubeconfig, environ))
        return context_namespace(docs, args.context)

    if args.command == "explain":
        ns, slash, name = str(args.workload).rpartition("/")
        if slash and args.namespace and ns != args.namespace:
            parser.error(f"{args.workload!r} names namespace {ns!r} but -n says {args.namespace!r}")
        return ["explain", f"{ns if slash else namespace()}/{name}", *_cluster_flags(args)]
    scope = [] if args.all_namespaces else ["--namespace", namespace()]
    if args.all_namespaces and args.namespace:
        parser.error("-A and -n exclude each other")
    return ["audit", *scope, *_cluster_flags(args), *(["--exit-zero"] if args.exit_zero else [])]


def main(argv: Sequence[str] | None = None) -> int:
    from ungater._cli.main import main as ungater_main

    translated = translate(sys.argv[1:] if argv is None else argv, os.environ)
    return ungater_main(translated)


if __name__ == "__main__":
    sys.exit(main())
