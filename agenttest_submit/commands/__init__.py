"""The subcommands of `agenttest-submit` besides a run, and `agenttest-demo`.

`subcommands`: status, report, db upgrade; `resume`: finish a stopped run;
`audit_judges` and `judge_labelling`: a run's judges asked again, and people's labels;
`history_commands`: diff, history, runs; `schema`: JSON Schemas for editors;
`metrics_exporter`: the fleet's progress for Prometheus; `viewer/`: the web
pages over the store; `demo_command`: `agenttest-demo`, the demo agents and suite.
"""
