"""``delayq dev up|down|status|env|user``: the embedded local stack.

Every action works on the stack of one state folder (``--state-dir``) and, unless
``--kafka-port``/``--zk-port`` say otherwise, on the ports ``up`` recorded there.
``--secure`` picks the secured stack (SASL_SSL, ACLs: dev/secure.py), which has its own
folder and ports, so it runs beside the plain one. An error is one line: what failed,
the value, the fix; never a traceback.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayq.dev import DevStack, StackError, cache_dir, default_state_dir
from delayq.dev.spark import MAX_WORKERS as MAX_SPARK_WORKERS
from delayq.dev.spark import WORKER_MEMORY as SPARK_WORKER_MEMORY
from delayq.dev.stack import DEFAULT_KAFKA_PORT, DEFAULT_SECURE_KAFKA_PORT, DEFAULT_SECURE_ZK_PORT, DEFAULT_ZK_PORT

console = Console()


def register(subparsers) -> None:
    dev = subparsers.add_parser("dev", help="the embedded local stack: real Kafka (KRaft) and ZooKeeper on loopback")
    actions = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("up", _up, "start Kafka and ZooKeeper (downloads the jars once), with --spark also a Spark standalone "
                    "master and workers, and wait until each answers"),
        ("down", _down, "stop the processes `up` started"),
        ("status", _status, "say what runs where"),
        ("env", _env, "print export lines for DELAYQ_BOOTSTRAP_SERVERS and DELAYQ_ZK_CONNECT (and, on a secured "
                      "stack, the admin's DELAYQ_KAFKA__* security settings and DELAYQ_ZK_AUTH; while the stack's "
                      "Spark master runs, DELAYQ_SPARK_MASTER)"),
        ("user", _user, "create a SCRAM user on the secured stack (the default folder's, unless --state-dir) and "
                        "print its settings as export lines"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("--state-dir", type=Path,
                            help=f"the stack's folder: its data, logs and recorded ports (default "
                                 f"{default_state_dir()}, with --secure {default_state_dir(secure=True)})")
        action.add_argument("--secure", action="store_true", default=None,
                            help="the secured stack: SASL_SSL with SCRAM-SHA-512 over TLS, ACLs enforced "
                                 "(default: whatever --state-dir holds)")
        action.add_argument("--kafka-port", type=int,
                            help=f"Kafka's first port: brokers take it and the next ones, controllers the "
                                 f"ports after them (default: the port `up` "
                                 f"recorded in --state-dir, else {DEFAULT_KAFKA_PORT}, secured "
                                 f"{DEFAULT_SECURE_KAFKA_PORT})")
        action.add_argument("--brokers", type=_broker_count, metavar="N",
                            help="Kafka brokers: 1 (a broker that is its own KRaft controller), or 2 to 9 with a "
                                 "quorum of three dedicated controllers, the internal topics at replication factor "
                                 "min(N, 3) and min.insync.replicas one less from three brokers on (default: the "
                                 "count `up` recorded in --state-dir, else 1)")
        action.add_argument("--zk-port", type=int,
                            help=f"ZooKeeper's port (default: the port `up` recorded in --state-dir, "
                                 f"else {DEFAULT_ZK_PORT}, secured {DEFAULT_SECURE_ZK_PORT})")
        action.set_defaults(func=_one_line(func))
    up = actions.choices["up"]
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for each service to answer")
    up.add_argument("--spark", action="store_true",
                    help="also start a Spark standalone master and workers (the Spark pyspark ships) on free loopback "
                         "ports, recorded in --state-dir: `delayq reconcile --master` takes the URL `delayq dev env` "
                         "prints as DELAYQ_SPARK_MASTER")
    up.add_argument("--spark-workers", type=_spark_worker_count, metavar="N",
                    help=f"Spark workers, 1 to {MAX_SPARK_WORKERS}, each offering the machine's cores shared between "
                         f"them and {SPARK_WORKER_MEMORY} of memory (default 1; implies --spark)")
    down = actions.choices["down"]
    down.add_argument(
        "--wipe", action="store_true", help="also delete the stack's data and logs (the next `up` starts an empty one)")
    down.add_argument("--spark", action="store_true", help="stop only the Spark master and workers")
    user = actions.choices["user"]
    user.add_argument("name", help="the SCRAM user (Kafka principal User:NAME); run again to print its settings again")
    user.add_argument("--zk", action="store_true",
                      help="also print the stack's ZooKeeper credentials (DELAYQ_ZK_AUTH): what a node needs")


def _one_line(func):
    """Every failure of an action as one line (cli.main prints it), never a traceback."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except StackError as err:
            message = " ".join(str(err).split())
        except OSError as err:
            message = _os_problem(args, err)
        raise StackError(message) from None

    return run


def _os_problem(args: argparse.Namespace, err: OSError) -> str:
    state_dir = Path(args.state_dir or default_state_dir(bool(args.secure))).expanduser()
    if state_dir.exists() and not state_dir.is_dir():
        return f"the state folder {state_dir} is a file, not a folder: choose another with --state-dir"
    what = f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")
    if err.filename and Path(err.filename).is_relative_to(cache_dir()):
        fix = "check that folder, or choose another jar cache with DELAYQ_CACHE_DIR"
    else:
        fix = "check that folder, or choose another state folder with --state-dir"
    return f"dev {args.action} failed ({what}); {fix}"


def stack_from(args: argparse.Namespace) -> DevStack:
    workers = getattr(args, "spark_workers", None)
    spark = getattr(args, "action", None) == "up" and (getattr(args, "spark", False) or workers is not None)
    return DevStack(args.state_dir, kafka_port=args.kafka_port, zk_port=args.zk_port, brokers=args.brokers,
                    start_timeout_s=getattr(args, "timeout", 90.0), secure=args.secure,
                    spark_workers=(workers or 1) if spark else 0)


def _broker_count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of brokers (1 to 9)") from None


def _spark_worker_count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of Spark workers (1 to {MAX_SPARK_WORKERS})") from None


def _up(args: argparse.Namespace) -> int:
    stack = stack_from(args)
    brokers = f"{stack.ports.brokers} Kafka brokers" if stack.ports.brokers > 1 else "Kafka"
    spark = (f", a Spark master and {stack.spark_workers} worker" + ("s" if stack.spark_workers > 1 else "")
             if stack.spark_workers else "")
    with console.status(f"starting {brokers} and ZooKeeper{spark}"):
        started = stack.up(say=console.print)
    what = ", ".join(started) if started else "nothing (all were running)"
    kind = " (SASL_SSL, SCRAM-SHA-512, ACLs enforced)" if stack.secure else ""
    console.print(f"started {what}; Kafka at {stack.bootstrap_servers}{kind}, ZooKeeper at {stack.zk_connect}",
                  highlight=False)
    ports = stack.spark_ports
    if stack.spark_workers and ports is not None:
        console.print(f"Spark master at {ports.master_url} (web UI {ports.master_ui_url}), {ports.workers} "
                      f"worker{'s' if ports.workers > 1 else ''}: delayq reconcile --master {ports.master_url}",
                      highlight=False, markup=False)
    if stack.secure:
        console.print(f"the admin's settings: eval \"$(delayq dev env --state-dir {stack.folder})\"; a user's: "
                      f"delayq dev user NAME --state-dir {stack.folder}", highlight=False, markup=False)
    return 0


def _down(args: argparse.Namespace) -> int:
    stack = stack_from(args)
    stopped = stack.down(stack.spark_services[::-1] if args.spark else None)
    console.print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running", highlight=False)
    if args.wipe:
        stack.wipe()
        console.print(f"deleted {stack.folder}", highlight=False, markup=False)
    return 0


def _status(args: argparse.Namespace) -> int:
    stack = stack_from(args)
    kind = "secured dev stack" if stack.secure else "dev stack"
    table = Table(title=escape(f"delayq {kind} ({stack.folder})"))
    for column in ("service", "version", "address", "pid", "state", "log"):
        table.add_column(column)
    healthy = True
    for status in stack.status():
        state = "healthy" if status.healthy else ("running, not answering" if status.running else "stopped")
        healthy &= status.healthy
        table.add_row(status.name, status.version, status.address, str(status.pid or "-"), state,
                      escape(str(status.log)))
    console.print(table)
    return 0 if healthy else 1


def _env(args: argparse.Namespace) -> int:
    _print_exports(_ran_here(args).env())
    return 0


def _user(args: argparse.Namespace) -> int:
    if args.state_dir is None and args.secure is None:
        args.secure = True  # users exist on the secured stack only: its folder is the default here
    stack = _ran_here(args)
    stack.add_user(args.name)
    _print_exports(stack.env(args.name, zk_auth=args.zk))
    return 0


def _ran_here(args: argparse.Namespace) -> DevStack:
    stack = stack_from(args)
    if args.kafka_port is None and args.zk_port is None and args.brokers is None and stack.recorded_ports() is None:
        secure = " --secure" if stack.secure else ""
        raise StackError(f"no dev stack has run in {stack.folder} (no ports recorded there): start one with "
                         f"delayq dev up{secure} --state-dir {stack.folder}")
    return stack


def _print_exports(env: dict[str, str]) -> None:
    # The values are delayq's own (addresses, generated URL-safe passwords, paths): shlex-quoted all the same.
    import shlex

    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")
