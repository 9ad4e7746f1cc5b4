"""What a run is given: the `-i` values turned into checked cases before anything runs.

`sources` classifies the `-i` values (case files, messages, generators); `expand`
turns them into a stream of checked cases, collecting every problem first;
`case_checks` what is checked of each case; `generate` cases from a generator agent
or script; `spool_lines` a checked case as the spool's lines; `human` the person at the
terminal, asked when an agent awaits input.
"""
