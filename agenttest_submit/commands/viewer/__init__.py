"""`agenttest-submit view [RUN]`: a local, read-only web server over the store.

`queries.py` reads runs, their case rows and a case's records from the store (SQLite
embedded, Postgres on a fleet); `web_app.py` serves the pages (the HTML report's, from
agenttest_worker/report/html_page/) and their JSON API under /api/, GET only, with a
Content-Security-Policy on every response; `serve.py` binds it: 127.0.0.1 unless told
otherwise, and never another address without a token.
"""
