"""The conversation pages the HTML report and `agenttest-submit view` share.

`data.py` turns a run's records into what the page renders (each record with the labels
and notes the console computes, one row per case, the run's header); `shell.py` writes
the page around it: one inline script (`dom.js`, `conversation.js` and `app.js`, package
data, joined) and one inline style (`app.css`), a Content-Security-Policy that allows
only them by hash, and JSON data elements that can never close their own `<script>`.
Everything from a run is rendered with DOM text nodes, never parsed as markup.
"""
