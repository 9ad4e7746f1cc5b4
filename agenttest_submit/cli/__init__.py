"""The command line of `agenttest-submit`: parsing, the typed request, exit codes.

`main` parses the run's arguments, `subcommand_args` the subcommands', both into the
typed requests of `request`; `arg_types` is what their parsers share; `exits` the exit
codes; `terminal` what the terminal can show; `stopping` SIGTERM handled as Ctrl-C;
`services` the database or the broker out of reach, said plainly.
"""

from agenttest_submit.cli.main import main

__all__ = ["main"]
