"""The ``ungater`` command line: run, check-config, plugins, explain, audit (and, from the dev
tools when installed, dev-cluster and demo).

Thin by design: it parses arguments, loads the config, and hands over to the library. Errors
are one line on stderr and a non-zero exit; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import yaml

from ungater import __version__
from ungater._cli.configfile import ConfigError, load_config
from ungater._model.config import Config

if TYPE_CHECKING:
    from ungater._plugins.binding import KindResolution
    from ungater._plugins.registry import PluginRegistry

__all__ = ["main"]

log = logging.getLogger("ungater")


class CliError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ungater",
        description="Release the gated pods of Kueue elastic jobs as far as admitted.",
    )
    p.add_argument("--version", action="version", version=f"ungater {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    # `--debug` after the command too (`ungater run --debug`); SUPPRESS keeps the top-level
    # value when it is not given there
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    add = sub.add_parser

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return add(name, help=text, description=text, parents=[common])

    def cluster_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", "-c", type=Path, help="config file (YAML); default: built-in")
        sp.add_argument(
            "--kubeconfig",
            type=Path,
            help="kubeconfig; default $KUBECONFIG, ~/.kube/config, then in-cluster",
        )
        sp.add_argument("--context", help="kubeconfig context; default: the current one")

    run = command("run", "run the controller")
    cluster_args(run)
    run.add_argument(
        "--no-leader-election",
        action="store_true",
        help="act without a Lease (one replica only: two would both release)",
    )
    check = command(
        "check-config",
        "validate a config file as `run` would (exit 2 if it would refuse it), print it",
    )
    check.add_argument("file", type=Path, help="the config file (YAML)")
    plugins = command("plugins", "list installed plugins and the kinds they serve")
    plugins.add_argument("--json", action="store_true", help="JSON instead of a table")
    explain = command("explain", "print why each pod of a workload is (not) released")
    explain.add_argument(
        "workload", metavar="NAMESPACE/WORKLOAD", help="the Workload (any slice of the owner)"
    )
    explain.add_argument("--json", action="store_true", help="the report as JSON")
    cluster_args(explain)
    audit = command(
        "audit", "read the cluster once and report over-releases, stalls and more (patches nothing)"
    )
    audit.add_argument("--namespace", "-n", help="only this namespace (default: the config's)")
    audit.add_argument("--json", action="store_true", help="the findings as JSON")
    audit.add_argument(
        "--exit-zero",
        action="store_true",
        help="exit 0 even when warnings are found (default: exit 3 then)",
    )
    cluster_args(audit)
    for name, found in _extra_commands().items():
        sp = command(name, found.help)
        if not isinstance(found, _Missing):  # a missing one takes any arguments (see main)
            found.add_arguments(sp)
        sp.set_defaults(extra=found)
    return p


#: commands the dev tools (devtools/, distribution ungater-devtools) provide; without them the
#: CLI still knows these names and says how to get them
_DEV_TOOLS_COMMANDS = {
    "dev-cluster": "a local control plane with the real Kueue, KubeRay, JobSet (needs the dev tools)",
    "demo": "a narrated elastic-job scenario on a local control plane (needs the dev tools)",
}
_INSTALL_DEV_TOOLS = (
    "the dev tools are not installed: run `make install` in an ungater checkout "
    "(or `pip install -e devtools` there)"
)


class _Missing:
    """Stands in for a command no installed distribution provides, or one that failed to load."""

    def __init__(self, name: str, help: str, why: str) -> None:
        self.name, self.help, self.why = name, help, why

    def run(self, args: argparse.Namespace) -> int:
        raise CliError(f"`ungater {self.name}`: {self.why}", code=2)


def _extra_commands() -> dict[str, Any]:
    """The commands other distributions add through the ``ungater.commands`` entry point group
    (objects with ``help``, ``add_arguments(parser)`` and ``run(args) -> int``), so that the
    runtime ships no dev tooling and loads it only where it is installed. A name the CLI has
    already is not replaced; one that fails to load becomes a command reporting why."""
    from importlib.metadata import entry_points

    found: dict[str, Any] = {
        name: _Missing(name, text, _INSTALL_DEV_TOOLS) for name, text in _DEV_TOOLS_COMMANDS.items()
    }
    for ep in entry_points(group="ungater.commands"):
        if ep.name in COMMANDS:
            continue
        try:
            found[ep.name] = ep.load()
        except Exception as exc:  # a broken install must not break `ungater run`
            why = f"cannot load it from {ep.value}: {type(exc).__name__}: {exc}"
            found[ep.name] = _Missing(ep.name, f"(broken: {exc})", why)
    return found


def _load(path: Path | None) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from exc


def _resolve(config: Config) -> tuple[PluginRegistry, KindResolution]:
    """The installed plugins and the kinds they serve as configured, or exit 2 with what
    ``run`` would refuse at start-up: ``run`` and ``check-config`` both call this, and the
    controller calls the same pure ``resolve_kinds``."""
    from ungater._model.errors import StartupError
    from ungater._plugins.binding import resolve_kinds
    from ungater._plugins.registry import PluginRegistry

    registry = PluginRegistry.discover(config.plugins.allow)
    try:
        return registry, resolve_kinds(config, registry)
    except StartupError as exc:
        raise CliError(str(exc), code=2) from exc


def cmd_check_config(args: argparse.Namespace) -> int:
    """Refuse (exit 2) what ``run`` would refuse before touching the cluster, with the same
    message: the file (``load_config``) and the kinds against the installed plugins
    (``_resolve``). Print the effective config, with the Lease's location filled in."""
    config = _load(args.file)
    _, resolved = _resolve(config)
    for failed in resolved.failures:
        print(
            f"ungater: warning: plugin {failed.label} unavailable: {failed.error}", file=sys.stderr
        )
    for skipped in resolved.skipped:
        print(
            f"ungater: warning: kind {skipped.kind} would be skipped: {skipped.reason}",
            file=sys.stderr,
        )
    if config.server.loopback:
        print(
            f"ungater: warning: server.address {config.server.address!r} is a loopback address: "
            "fine on a workstation, but a kubelet's probes cannot reach it in a pod",
            file=sys.stderr,
        )
    dumped = config.dump()
    if config.leader_election.enabled:
        dumped["leaderElection"].update(
            namespace=config.lease_namespace, leaseName=config.lease_name
        )
    yaml.safe_dump(dumped, sys.stdout, sort_keys=False)
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from ungater._plugins.registry import PluginRegistry

    registry = PluginRegistry.discover()
    rows = [p.as_dict() for p in registry.plugins.values()]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print("no plugins installed")
    for r in rows:
        dist = f"{r['distribution']} {r['version']}".strip() or "-"
        status = f"  ERROR: {r['error']}" if r["error"] else ""
        print(f"{r['name']:<16} {', '.join(r['kinds']) or '-':<32} {dist}{status}")
    return 1 if registry.failures else 0


async def _client(args: argparse.Namespace, config: Config) -> Any:
    from ungater._kube.adapter import connect

    c = config.client
    try:
        return await connect(
            args.kubeconfig,
            args.context,
            qps=c.qps,
            burst=c.burst,
            request_timeout=c.request_timeout_seconds,
            pool_size=c.patch_concurrency + 16 * max(1, len(config.namespaces)),
        )
    except Exception as exc:
        raise CliError(f"cannot configure a Kubernetes client: {exc}") from exc


def cmd_run(args: argparse.Namespace) -> int:
    from ungater._observe.logs import setup_logging

    config = _load(args.config)
    registry, _ = _resolve(config)  # refuse a config before connecting, as check-config does
    if args.no_leader_election:
        le = config.leader_election.model_copy(update={"enabled": False})
        config = config.model_copy(update={"leader_election": le})
    setup_logging(config.logging.level, config.logging.format)
    return anyio.run(_run, args, config, registry)


async def _run(args: argparse.Namespace, config: Config, registry: PluginRegistry) -> int:
    from ungater._controller.manager import serve
    from ungater._model.errors import StartupError

    client = await _client(args, config)
    stop = anyio.Event()
    error = ""
    try:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        log.info("received %s, shutting down", signal.Signals(signum).name)
                        stop.set()
                        return

            tg.start_soon(on_signal)
            try:
                ctl = await serve(config, client, registry, stop)
                error = ctl.state.fatal_error  # e.g. standDown.action: exit
                log.info("totals: %s", ctl.stats.summary())
            except StartupError as exc:
                error = str(exc)
            except OSError as exc:  # the HTTP server's port is taken, for one
                error = f"cannot start: {exc}"
            tg.cancel_scope.cancel()
    finally:
        await client.close()
    if error:  # raised here, not inside the task group, so it is not wrapped in a group
        raise CliError(error)
    log.info("stopped")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    config = _load(args.config)
    ns, _, name = args.workload.partition("/")
    if not ns or not name:
        raise CliError("expected NAMESPACE/WORKLOAD", code=2)
    return anyio.run(_explain, args, config, ns, name)


async def _explain(args: argparse.Namespace, config: Config, ns: str, name: str) -> int:
    from ungater._cli.explain import ExplainError, explain, render_text
    from ungater._kube.client import ApiError
    from ungater._plugins.registry import PluginError, PluginRegistry

    registry = PluginRegistry.discover(config.plugins.allow)
    client = await _client(args, config)
    try:
        report = await explain(client, config, registry, ns, name)
    except (ExplainError, ApiError, LookupError, PluginError) as exc:
        raise CliError(str(exc)) from exc
    finally:
        await client.close()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_text(report))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    config = _load(args.config)
    return anyio.run(_audit, args, config)


async def _audit(args: argparse.Namespace, config: Config) -> int:
    from ungater._cli.audit import audit_cluster, render_findings
    from ungater._cli.explain import ExplainError
    from ungater._kube.client import ApiError
    from ungater._plugins.registry import PluginError, PluginRegistry

    registry = PluginRegistry.discover(config.plugins.allow)
    client = await _client(args, config)
    try:
        report = await audit_cluster(client, config, registry, args.namespace)
    except (ExplainError, ApiError, LookupError, PluginError) as exc:
        raise CliError(str(exc)) from exc
    finally:
        await client.close()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_findings(report))
    # like a linter: 3 when something needs attention, so a cron job or CI step can alert
    warnings = [f for f in report["findings"] if f.get("severity") == "warning"]
    return 3 if warnings and not args.exit_zero else 0


COMMANDS = {
    "run": cmd_run,
    "check-config": cmd_check_config,
    "plugins": cmd_plugins,
    "explain": cmd_explain,
    "audit": cmd_audit,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not isinstance(getattr(args, "extra", None), _Missing):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.command:
        parser.print_help()
        return 2
    try:
        extra = getattr(args, "extra", None)
        code: int = extra.run(args) if extra is not None else COMMANDS[args.command](args)
        return code
    except CliError as exc:
        if args.debug:
            raise
        print(f"ungater: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ungater plugins | head -1`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 0
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"ungater: error: {type(exc).__name__}: {exc} (use --debug for details)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
