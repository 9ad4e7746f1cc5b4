"""A run carried out: embedded in this process or on the worker fleet, then reported.

`submit` carries out a run request; `runner` is what every run shares (its options,
storing it with its cases, finding it again) and `storing` stores a new run;
`embedded` plays it in this process, `driving` holds the lock of the process driving
it; `distributed` enqueues it on the fleet and `fleet_watch` watches it there;
`reeval` judges stored conversations again; `progress` the progress line; `output`
the report where the user asked for it, `reporter_agent` a custom reporter's account.
"""
