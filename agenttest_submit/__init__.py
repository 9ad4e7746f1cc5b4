"""agenttest's client: `agenttest-submit`, from the command line to the exit code.

A command line becomes a request once, and the request flows one way through the
modules; nothing imports `cli`, and no two modules import each other:

    cli             argument parsing only: the parsers, the request built from the
                    arguments, the entry point called, input problems printed
    request         the typed requests: RunRequest (a run, a re-evaluation), and one
                    per subcommand (status, report, resume, db)
    submit          a run request carried out: checked against agenttest.yaml (every
                    problem at once), its inputs expanded, then a dry run, a
                    re-evaluation or a run
    inputs          the `-i` values classified: case files, messages, generators
    expand          inputs into a stream of checked cases (spooled before anything runs)
    generate        cases from a generator agent or script (`-i agents:ID`)
    runner          what every run shares: its options, storing it with its cases
                    (each batch handed to a starter as it is stored), finding it again
    embedded        a run in this process: its conversations, `--parallel` at a time
    distributed     a run on the worker fleet: enqueue, watch, recover, report
    reeval          `--reeval`: stored conversations judged again without the target
    resume          `resume RUN`: the unfinished conversations of a run played on
    commands        the subcommands: status, report, resume, db upgrade
    output          the report on stdout, in `-o`, to a `--reporter` agent; exit code
    reporter_agent  the reporter agent's request and call
    human           asking the person at the terminal when an agent awaits input
    progress        the progress line on stderr
    stopping        SIGTERM handled as Ctrl-C; the exit codes of an interrupted run
    services        the database or the broker out of reach, said plainly
    exits           the exit codes

This package imports none of its modules here, so that the command starts without
importing what it does not need (the store, Celery, aiohttp).
"""
