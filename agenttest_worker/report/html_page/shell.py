"""The page around the data: one inline style and one inline script, allowed by hash.

The Content-Security-Policy names the SHA-256 of the script and the style and nothing
else (`default-src 'none'`): a `<script>` or an `onerror=` that found its way into the
page from a run's data would not run, though the script never parses data as markup in
the first place. The HTML report carries the policy in a `<meta>` element (a file has
no headers) and may fetch nothing; the viewer also sends it as a header and lets the
page fetch its own origin's /api/.
"""

from __future__ import annotations

import base64
import hashlib
import html
from functools import cache
from importlib.resources import files
from typing import Any

from agenttest_worker.report.html_page.data import script_json
from agenttest_worker.report.wording import WORDS

_PACKAGE = "agenttest_worker.report.html_page"


# The page's one script, in this order; each file's names are visible to the next.
_SCRIPTS = ("dom.js", "markdown.js", "tables.js", "conversation.js", "analysis.js", "app.js")


@cache
def assets() -> tuple[str, str]:
    """(the page's script, its style) as shipped with the package: the scripts are
    joined in one function scope, so that the page holds one script and no globals."""
    folder = files(_PACKAGE)
    parts = [folder.joinpath(name).read_text(encoding="utf-8") for name in _SCRIPTS]
    script = "(() => {\n" + "\n".join(parts) + "})();\n"
    style = folder.joinpath("app.css").read_text(encoding="utf-8")
    # Either would end its own element early, and the hash would no longer match.
    assert "</script" not in script.lower() and "</style" not in style.lower()
    return script, style


def _hash(text: str) -> str:
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


def policy(*, served: bool = False) -> str:
    """The Content-Security-Policy of a page: the report's, or with `served` the
    viewer's, which may fetch its own /api/ (its header adds frame-ancestors, which a
    `<meta>` policy cannot hold)."""
    script, style = assets()
    parts = [
        "default-src 'none'",
        f"script-src {_hash(script)}",
        f"style-src {_hash(style)}",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
    ]
    if served:
        parts.append("connect-src 'self'")
    return "; ".join(parts)


def page_start(title: str, config: dict[str, Any], *, served: bool = False) -> str:
    """The page up to its data elements: the policy, the style, and the page's config
    (which page it is: the report, or one of the viewer's)."""
    _, style = assets()
    # (Hashes are base64: no '"' to escape, and the single quotes stay readable.)
    csp = html.escape(policy(served=served), quote=False)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{style}</style></head>\n<body>"
        '<noscript>This page shows its results with JavaScript.</noscript><main id="app"></main>\n'
        f"{data_element('agenttest-config', config)}\n"
        # The words the page shows for codes (report/wording.py).
        f"{data_element('agenttest-words', WORDS)}\n"
    )


def data_element(element_id: str, value: Any) -> str:
    return f"{data_open(element_id)}{script_json(value)}</script>"


def data_open(element_id: str) -> str:
    """The start of a JSON data element (its text must go through data.script_text)."""
    return f'<script type="application/json" id="{element_id}">'


def page_end() -> str:
    script, _ = assets()
    return f"\n<script>{script}</script></body></html>\n"
