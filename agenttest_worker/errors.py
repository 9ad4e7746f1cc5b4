"""Input problems: everything wrong with what the user gave us, located precisely.

A case file with errors is rejected before anything runs, so loaders collect every
problem they can find (not just the first) and raise them together.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote_plus

# A field's place in a case: ("turns", 0, "assertions", 1, "use").
FieldPath = tuple[str | int, ...]


def format_field(path: FieldPath) -> str:
    """turns[0].assertions[1].use"""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


@dataclass(frozen=True)
class InputProblem:
    """One thing wrong with an input, located by file, line (or test name) and field."""

    message: str
    file: str | None = None
    line: int | None = None
    field: str | None = None
    test: str | None = None
    # The id of the case it is about, when it has one (not shown: `test` names it): a
    # later case with the same id is still a duplicate of this one.
    case_id: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        # A problem may quote the URL it is about (an agent's base_url, an attachment):
        # shown with its secrets masked, like every URL agenttest writes.
        object.__setattr__(self, "message", redact(self.message))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
        if self.test:
            where += f" (test {self.test!r})" if where else f"test {self.test!r}"
        parts = [p for p in (where, self.field) if p]
        parts.append(self.message)
        return ": ".join(parts)


class InputError(Exception):
    """One or more input problems; the CLI prints each and exits with code 2."""

    def __init__(self, problems: list[InputProblem] | InputProblem | str) -> None:
        if isinstance(problems, str):
            problems = [InputProblem(problems)]
        elif isinstance(problems, InputProblem):
            problems = [problems]
        self.problems: list[InputProblem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ConfigError(InputError):
    """A problem in agenttest.yaml or the environment it refers to."""


# -- secrets in URLs -----------------------------------------------------------------------
# Every URL written anywhere (an error, a record, a report, a log line) goes through
# `redact_url`, and every text that may quote one through `redact`: agents' errors quote
# the URL they failed on (aiohttp's errors, a gateway's error page, a redirect), and a
# URL may carry a password or a key that the user passed through the environment.

MASK = "***"
# A query parameter is key-like, and its value hidden whatever it holds, when its name
# (case-insensitive) contains one of these.
SECRET_PARAM_WORDS = (
    "key", "token", "secret", "pass", "pwd", "auth", "sig", "credential", "session", "jwt",
)  # fmt: skip
# Values shorter than this are not looked for in free text: replacing every "1" of an
# error because `?token=1` would hide the error, not a secret.
_MIN_SECRET = 4
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def is_secret_param(name: str) -> bool:
    lowered = unquote_plus(name).lower()
    return any(word in lowered for word in SECRET_PARAM_WORDS)


def _parts(url: str) -> tuple[str, str, str, str, str]:
    """(scheme://, userinfo, rest of the authority and path, query, #fragment), as written."""
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    else:
        head += sep
    # A password from the environment may hold "/" or "#", which end the authority: a
    # user:password@ before the query is taken for userinfo all the same (masking a path
    # that looks like one is the safe mistake).
    before_query = rest.split("?", 1)[0]
    authority = before_query.split("/", 1)[0].split("#", 1)[0]
    userinfo, at, _ = before_query.rpartition("@")
    if "@" in authority:
        userinfo = authority.rpartition("@")[0]
    elif not (at and ":" in userinfo):
        userinfo = ""
    if userinfo:
        rest = rest[len(userinfo) + 1 :]
    rest, hash_, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    return head, userinfo, rest, query, hash_ + fragment


def _userinfo_secrets(userinfo: str, written: str) -> list[str]:
    """A password; a user name alone (tokens travel that way) or written as ${VAR}."""
    user, colon, password = userinfo.partition(":")
    hidden = [password] if colon else [user]
    if colon and "${" in written.partition(":")[0]:
        hidden.append(user)
    return [value for value in hidden if value]


def _query_secrets(query: str, written: str) -> list[str]:
    from_env = {
        unquote_plus(name)
        for name, _, value in (p.partition("=") for p in written.split("&"))
        if "${" in value
    }
    return [
        value
        for name, _, value in (p.partition("=") for p in query.split("&"))
        if value and (is_secret_param(name) or unquote_plus(name) in from_env)
    ]


def url_secrets(url: str, written: str | None = None) -> list[str]:
    """What of `url` must never be shown: its userinfo password (or a user name alone),
    and the value of every query parameter that is key-like or that `written` (the URL
    as agenttest.yaml has it, before ${VAR} interpolation) takes from the environment."""
    parts, template = _parts(url), _parts(written or "")
    return [
        *_userinfo_secrets(parts[1], template[1]),
        *_query_secrets(parts[3], template[3]),
    ]


def redact_url(url: str, written: str | None = None) -> str:
    """`url` fit to show: the secrets `url_secrets` names replaced by ***."""
    parts, template = _parts(url), _parts(written or "")
    head, userinfo, rest, query, fragment = parts
    if userinfo:
        hidden = set(_userinfo_secrets(userinfo, template[1]))
        user, colon, password = userinfo.partition(":")
        shown_user = MASK if user in hidden else user
        userinfo = shown_user + (colon + MASK if password else colon) + "@"
    if query:
        hidden_values = set(_query_secrets(query, template[3]))
        params = []
        for param in query.split("&"):
            name, eq, value = param.partition("=")
            params.append(name + eq + MASK if eq and value in hidden_values else param)
        query = "?" + "&".join(params)
    return head + userinfo + rest + query + fragment


def hidden_forms(hidden: Iterable[str]) -> tuple[str, ...]:
    """The texts `hide` replaces for `hidden`: each value as is and percent-encoded (and
    decoded), the longest first, none shorter than a secret is looked for."""
    forms = {form for value in hidden for form in (value, unquote_plus(value), quote(value))}
    return tuple(sorted((f for f in forms if len(f) >= _MIN_SECRET), key=len, reverse=True))


def hide(text: str, forms: tuple[str, ...]) -> str:
    """`text` with every one of `forms` (`hidden_forms`) replaced by ***; nothing else
    changed (an agent's reply keeps its URLs as it wrote them)."""
    for value in forms:
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact(text: str, hidden: Iterable[str] = ()) -> str:
    """`text` with every `hidden` value (as is and percent-encoded) replaced by ***, and
    every URL in it redacted (`redact_url`)."""
    text = hide(text, hidden_forms(hidden))
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)
