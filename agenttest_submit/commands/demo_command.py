"""`agenttest-demo`: command line for the demo agents.

    agenttest-demo serve [--host 127.0.0.1] [--port 8700]
    agenttest-demo run [AGENTTEST-SUBMIT ARGS...]

`serve` prints the base URL (e.g. "http://127.0.0.1:8700/v1", the `base_url` to put in
agenttest.yaml) on one line and serves until Ctrl-C or SIGTERM; it exits 0 then, and 1
when the address cannot be bound. `--port 0` picks a free port (the printed URL tells
which). Subcommands are registered in `_parser()`, one function each.

`run` is the quickstart: it serves the demo agents on a free port and runs
`agenttest-submit` on the bundled suite (demo/suite/: a scripted multi-turn case, a
simulator-driven case, an agent-judged turn, a case skipped for missing input and a
failing case) against them over HTTP. Extra arguments go to agenttest-submit
(`agenttest-demo run -v`, `agenttest-demo run -o results.jsonl`); it exits with
agenttest-submit's exit code (1: the suite has a failing case on purpose).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable

from agenttest_worker.demo import SUITE, DemoServer, start_site

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700

Command = Callable[[argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (argparse exits 2 on usage errors)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["run"]:
        # Everything after `run` belongs to agenttest-submit, options included.
        return _run(argparse.Namespace(submit_args=arguments[1:]))
    args = _parser().parse_args(arguments)
    command: Command = args.command_func
    return command(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agenttest-demo",
        description="Deterministic demo agents speaking the OpenAI Chat Completions protocol.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="serve the demo agents over HTTP")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 picks one"
    )
    serve.set_defaults(command_func=_serve)

    run = commands.add_parser(
        "run", help="serve the demo agents and run the bundled suite against them"
    )
    run.add_argument("submit_args", nargs=argparse.REMAINDER, help="passed to agenttest-submit")
    run.set_defaults(command_func=_run)
    return parser


def _run(args: argparse.Namespace) -> int:
    from agenttest_submit.cli.main import main as submit

    extra = list(args.submit_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    has_input = any(a in ("-i", "--input") or a.startswith("--input=") for a in extra)
    defaults = [] if has_input else ["-i", str(SUITE / "expense-suite.jsonl")]
    if not any(a in ("-n", "--name") for a in extra):
        defaults += ["-n", "assistants.expense"]
    if not any(a == "--config" or a.startswith("--config=") for a in extra):
        defaults += ["--config", str(SUITE / "agenttest.yaml")]
    with DemoServer(port=0) as server:
        os.environ["AGENTTEST_DEMO_URL"] = server.base_url
        print(f"demo agents serving at {server.base_url}", file=sys.stderr, flush=True)
        return submit([*defaults, *extra])


def _serve(args: argparse.Namespace) -> int:
    try:
        asyncio.run(_serve_until_stopped(args.host, args.port))
    except KeyboardInterrupt:  # where signal handlers are unavailable (Windows)
        pass
    except OSError as exc:
        print(f"agenttest-demo: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve_until_stopped(host: str, port: int) -> None:
    runner, url = await start_site(host, port)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Windows has no loop signal handlers: Ctrl-C still ends asyncio.run there.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stopped.set)
    # Flushed at once: scripts read this line to learn the URL (and the port, with 0).
    print(url, flush=True)
    try:
        await stopped.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    sys.exit(main())
