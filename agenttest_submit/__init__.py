"""agenttest's client: `agenttest-submit`, from the command line to the exit code.

A command line becomes a request once, and the request flows one way through four
packages:

    cli/        the parsers, the typed request built from the arguments, the entry
                point, exit codes, the terminal, SIGTERM handled as Ctrl-C
    inputs/     the `-i` values turned into checked cases (files, messages,
                generators), and the person at the terminal for --interactive
    run/        a run carried out: checked against agenttest.yaml, stored, played in
                this process or on the fleet, re-judged, reported
    commands/   every other subcommand: status, report, resume, db, schema, diff,
                history, runs, metrics, view; and `agenttest-demo`

It uses agenttest_worker only through its packages' faces, and nothing in
agenttest_worker imports it. This package imports none of its modules here, so that
the command starts without importing what it does not need (the store, Celery).
"""
