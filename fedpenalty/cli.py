"""Command line: ``fedpenalty simulate``, ``run``, ``owner serve``/``report``, ``account``,
``init``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .cli_account import add_account
from .cli_print import print_run, run_warnings, stop_message, table, unreported_lines
from .errors import FedPenaltyError

#: What other modules, scenarios and tests import from here (the printing helpers live in
#: ``cli_print``, the account subcommand in ``cli_account``).
__all__ = ["build_parser", "main", "run_warnings", "stop_message", "table", "unreported_lines"]


def cmd_simulate(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .coordinator.algorithms import ALGORITHMS
    from .coordinator.base import ReleaseAlgorithm
    from .simulation import resume_simulation, simulate

    if args.resume:
        if args.scenario or args.set or args.out:
            raise FedPenaltyError(
                "--resume continues a simulation as it was configured: give no scenario, --set "
                "or --out"
            )
        result = resume_simulation(args.resume, False if args.no_progress else None)
    else:
        progress = False if args.no_progress else None
        _warn_unread(load_scenario(args.scenario, args.set or []))
        result = simulate(args.scenario, args.set or [], args.out, progress)
    scenario = load_scenario(result.out / "config.toml")
    model, sampler = scenario["model"], scenario["sampler"]
    algorithm = ALGORITHMS[sampler["algorithm"]]
    transport = "" if algorithm.query is None else f", {scenario['run']['transport']} transport"
    warmup = "" if isinstance(algorithm, ReleaseAlgorithm) else f" (+{sampler['warmup']} warmup)"
    dim = len(result.diagnostics.get("param_names", ())) or model.get("dim", 1)
    print_run(
        f"fedpenalty simulate: {sampler['algorithm']} on {model['name']} (dim {dim}), "
        f"{scenario['data']['owners']} owners{transport}, {sampler['chains']} chains × "
        f"{sampler['iterations']} "
        f"draws{warmup}",
        result,
    )
    return _exit_status(result, resumable=algorithm.query is not None, command="simulate")


def _warn_unread(scenario) -> None:
    """Warn on stderr, before the run, of every key the user set that this run does not read
    (``config.unread_keys``)."""
    from .config import unread_keys

    for line in unread_keys(scenario):
        print(f"warning: {line}", file=sys.stderr)


def _exit_status(result, resumable: bool, command: str = "run") -> int:
    """Print ``run_warnings`` to stderr; 3 when the run stopped early, else 0."""
    for line in run_warnings(result, resumable, command):
        print(line, file=sys.stderr)
    return 3 if result.stopped is not None else 0


def _tls(args: argparse.Namespace):
    from .owner.owner_config import TlsFiles

    given = [args.tls_cert, args.tls_key, args.tls_ca]
    if not any(given):
        return None
    if not all(given):
        raise FedPenaltyError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    for flag, file in zip(("--tls-cert", "--tls-key", "--tls-ca"), given):
        if not Path(file).is_file():
            raise FedPenaltyError(f"{flag} {file}: no such file")
    return TlsFiles(Path(args.tls_cert), Path(args.tls_key), Path(args.tls_ca))


def cmd_run(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .simulation import resume_run, run_deployed

    owners = [a.strip() for a in args.owners.split(",") if a.strip()] if args.owners else None
    for address in owners or []:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise FedPenaltyError(
                f"--owners: {address!r} is not HOST:PORT (the address and port an owner's "
                "server.listen serves on, e.g. a.example.org:50051)"
            )
    if args.resume:
        if args.scenario or args.set or args.out:
            raise FedPenaltyError(
                "--resume continues a run as it was configured: give no scenario, --set or --out"
            )
        result = resume_run(args.resume, owners, _tls(args), False if args.no_progress else None)
    else:
        if not args.scenario or not owners:
            raise FedPenaltyError(
                "give a scenario and --owners HOST:PORT[,HOST:PORT...] (or --resume DIR)"
            )
        scenario = load_scenario(args.scenario, args.set or [])
        _warn_unread(scenario)
        if args.no_progress:
            scenario["run"]["progress"] = False
        result = run_deployed(scenario, owners, _tls(args), args.out)
    owners_n = (
        len(result.privacy.get("owners", [])) + len(result.privacy.get("unreported", [])) or "the"
    )
    algorithm = load_scenario(result.out / "config.toml")["sampler"]["algorithm"]
    print_run(f"fedpenalty run: {algorithm} with {owners_n} deployed owners", result)
    return _exit_status(result, resumable=True)


def cmd_owner_serve(args: argparse.Namespace) -> int:
    import logging

    from .owner import Ledger
    from .owner.host import OwnerHost
    from .owner.owner_config import build_node, load_owner_config
    from .owner.server import check_exposure, serve

    configs = [load_owner_config(path, args.listen, args.ledger) for path in args.owner_files]
    for config in configs:
        config.check_servable()
    first = configs[0]
    for c in configs[1:]:
        shared = (
            "listen",
            "tls",
            "allowed_clients",
            "max_message_bytes",
            "peer_ca",
            "allowed_peers",
            "secure_sessions_per_day",
        )
        for key in shared:
            if getattr(c, key) != getattr(first, key):
                raise FedPenaltyError(
                    f"owners served by one process must share server.{key}: "
                    f"{c.name!r} differs from {first.name!r}"
                )
    check_exposure(first.listen, first.tls, first.allowed_clients, args.insecure)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fedpenalty.owner %(message)s")
    ledgers: dict[Path, Ledger] = {}
    try:
        nodes = []
        for c in configs:
            if c.ledger.resolve() not in ledgers:
                ledgers[c.ledger.resolve()] = Ledger(c.ledger, synchronous=c.synchronous)
            nodes.append(build_node(c, ledgers[c.ledger.resolve()]))
        serve(
            OwnerHost(nodes),
            first.listen,
            first.tls,
            first.max_message_bytes,
            allowed_clients=first.allowed_clients,
            insecure=args.insecure,
            peers=first.peer_auth(),
            key_requests=first.key_requests(),
        )
    finally:
        for ledger in ledgers.values():
            ledger.close()
    return 0


def cmd_owner_report(args: argparse.Namespace) -> int:
    from .owner.owner_config import load_owner_config
    from .owner.report import owner_report, report_text

    config = load_owner_config(args.owner_file, ledger=args.ledger)
    if not config.ledger.is_file():
        raise FedPenaltyError(
            f"no ledger at {config.ledger}: owner {config.name!r} has never served from it"
        )
    report = owner_report(config)
    print(json.dumps(report) if args.json else report_text(report, config))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from .deployment import DEFAULT_PORT, OWNERS, RECORDS, SCENARIO, write_deployment

    port = DEFAULT_PORT if args.port is None else args.port
    done = write_deployment(Path(args.folder), port, args.force)
    sampler = SCENARIO["sampler"]
    kept = "".join(
        f"kept {ledger}: its spend still counts against its owner's budget (delete it to start "
        "afresh)\n"
        for ledger in done.kept_ledgers
    )
    servers = "".join(f"  fedpenalty owner serve {n}.toml > {n}.log 2>&1 &\n" for n in OWNERS)
    files = {
        "ca.crt, ca.key": "the study's CA",
        f"{OWNERS[0]}.toml, …": f"{len(OWNERS)} owners on {', '.join(done.addresses)}, each "
        f"with its certificate (localhost, 127.0.0.1) and {RECORDS:,} records (.csv)",
        "coordinator.crt, .key": "the coordinator's client certificate",
        "scenario.toml": f"the coordinator's scenario: {sampler['algorithm']}, "
        f"{sampler['chains']} chains × {sampler['iterations']:,} draws",
    }
    print(
        f"fedpenalty init: a deployment on this machine, under mutual TLS, in {done.folder}/\n"
        + "".join(f"  {name:<22} {what}\n" for name, what in files.items())
        + f"Private keys (*.key) are readable by you only.\n{kept}"
        f"Next, in {done.folder}/: start the owners, run the coordinator, stop the owners:\n"
        f"{servers}  {done.run_command()} --out runs/first\n"
        "  kill %1 %2 %3"
    )
    return 0


def _add_init(sub: argparse._SubParsersAction) -> None:
    init = sub.add_parser(
        "init",
        help="write a deployment on this machine: CA, certificates, three owners, a scenario",
    )
    init.add_argument("folder", metavar="DIR", help="a new or empty folder")
    init.add_argument(
        "--port",
        type=int,
        help="the first owner's port; the others serve on the next ones (default 50051)",
    )
    init.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty DIR, replacing the files init writes (ledgers are kept)",
    )
    init.set_defaults(func=cmd_init)


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "simulate", help="run a local multi-owner simulation (default: the embedded scenario)"
    )
    sim.add_argument(
        "scenario", nargs="?", help="scenario TOML file (default: embedded default scenario)"
    )
    sim.add_argument(
        "--set", action="append", metavar="SECTION.KEY=VALUE", help="override a scenario key"
    )
    sim.add_argument("--out", help="run directory (default: run.out or runs/<algorithm>-<time>)")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sim.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the stopped or interrupted simulation in DIR from its checkpoint",
    )
    sim.set_defaults(func=cmd_simulate)


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run", help="run the coordinator against deployed owners (or --resume a stopped run)"
    )
    run.add_argument(
        "scenario",
        nargs="?",
        help="scenario TOML ([model] and [sampler]; owners' policies govern privacy)",
    )
    run.add_argument(
        "--owners", help="owner hosts HOST:PORT[,HOST:PORT...] (with --resume: where they are now)"
    )
    run.add_argument(
        "--tls-cert", help="this coordinator's client certificate (PEM) for mutual TLS"
    )
    run.add_argument("--tls-key", help="its private key (PEM)")
    run.add_argument(
        "--tls-ca", help="CA certificate (PEM) that signed the owners' server certificates"
    )
    run.add_argument(
        "--set", action="append", metavar="SECTION.KEY=VALUE", help="override a scenario key"
    )
    run.add_argument("--out", help="run directory (default: run.out or runs/<algorithm>-<time>)")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.set_defaults(func=cmd_run)


def _add_owner(sub: argparse._SubParsersAction) -> None:
    owner = sub.add_parser("owner", help="serve an owner, or read its ledger").add_subparsers(
        dest="owner_command", required=True
    )
    serve = owner.add_parser(
        "serve", help="serve OWNER.toml (several files: one process hosts them all)"
    )
    serve.add_argument("owner_files", nargs="+", metavar="OWNER.toml")
    serve.add_argument("--listen", help="HOST:PORT (overrides server.listen)")
    serve.add_argument("--ledger", help="ledger file (overrides server.ledger)")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="serve without mutual TLS on a non-loopback address: anyone who reaches it can "
        "query the owners and spend their budgets",
    )
    serve.set_defaults(func=cmd_owner_serve)
    report = owner.add_parser(
        "report", help="an owner's privacy spend, read offline from its ledger"
    )
    report.add_argument("owner_file", metavar="OWNER.toml")
    report.add_argument("--ledger", help="ledger file (overrides server.ledger)")
    report.add_argument("--json", action="store_true", help="print JSON")
    report.set_defaults(func=cmd_owner_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedpenalty", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fedpenalty {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_simulate, _add_run, _add_owner, add_account, _add_init):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FedPenaltyError, ValueError, FileExistsError, FloatingPointError) as exc:
        print(f"fedpenalty: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedpenalty: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
