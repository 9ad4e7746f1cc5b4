"""`agenttest-submit view [RUN]`: a local web server over the store, read-only but for
people's labels of judged verdicts.

`queries.py` reads runs, their case rows and a case's records from the store (SQLite
embedded, Postgres on a fleet); `web_app.py` serves the pages (the HTML report's, from
agenttest_worker/report/html_page/) and their JSON API under /api/, GET only (and a
label's same-origin JSON POST, which judge_labelling.py checks and keeps), with a
Content-Security-Policy on every response; `serve.py` binds it: 127.0.0.1 unless told
otherwise, and never another address without a token.
"""
