"""`python -m agenttest_submit.commands.github_comment BODY.md`: post a run's Markdown
(its summary and diff) on the pull request a GitHub Actions job runs for, as one
comment that later runs update instead of adding more.

It reads what the runner provides: GITHUB_API_URL, GITHUB_REPOSITORY, the event's JSON
at GITHUB_EVENT_PATH (the pull request's number) and GITHUB_TOKEN. Our comment is the
one whose body holds MARKER: found through every page of the issue's comments, then
PATCHed; else one is POSTed. Exit 0 when posted, or when there is nothing to post on
(not a pull request, or a token that may not write: a pull request from a fork);
2 when the environment lacks something; 1 when GitHub refuses.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

MARKER = "<!-- agenttest -->"
# GitHub refuses a comment body over 65,536 characters.
MAX_BODY = 65_536
_CUT = "\n\n… (cut: the whole report is the job's artifact)\n"
_TIMEOUT = aiohttp.ClientTimeout(total=60)


class CommentError(Exception):
    """Something to say instead of a traceback, with the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Target:
    """Where the comment goes and with what token."""

    api_url: str
    repository: str
    number: int
    token: str

    @property
    def comments_url(self) -> str:
        return f"{self.api_url}/repos/{self.repository}/issues/{self.number}/comments"

    def headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        }


def pull_request_number(event_path: str | None) -> int | None:
    """The pull request's (or issue's) number in the event's JSON, None for an event
    without one (a push, a schedule)."""
    if not event_path:
        return None
    try:
        event = json.loads(Path(event_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommentError(f"cannot read GITHUB_EVENT_PATH {event_path}: {exc}", 2) from exc
    for key in ("pull_request", "issue"):
        number = (event.get(key) or {}).get("number") if isinstance(event, dict) else None
        if isinstance(number, int):
            return number
    return None


def target_from(environ: Mapping[str, str]) -> Target | None:
    """The comment's target from the runner's variables; None: not a pull request."""
    number = pull_request_number(environ.get("GITHUB_EVENT_PATH"))
    if number is None:
        return None
    token = environ.get("GITHUB_TOKEN", "")
    if not token:
        raise CommentError("GITHUB_TOKEN is not set: the comment needs a token", 2)
    repository = environ.get("GITHUB_REPOSITORY", "")
    if repository.count("/") != 1:
        raise CommentError("GITHUB_REPOSITORY is not set as OWNER/NAME", 2)
    api_url = environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
    return Target(api_url, repository, number, token)


def comment_body(markdown: str) -> str:
    """The marker, then the Markdown, cut to what GitHub takes."""
    body = f"{MARKER}\n{markdown}"
    if len(body) > MAX_BODY:
        body = body[: MAX_BODY - len(_CUT)] + _CUT
    return body


async def _checked(response: aiohttp.ClientResponse) -> Any:
    if response.status >= 400:
        try:
            said = str((await response.json()).get("message", ""))
        except (aiohttp.ContentTypeError, ValueError, AttributeError):
            said = ""
        code = 0 if response.status == 403 else 1
        why = " (the token may not write comments: a pull request from a fork?)" if not code else ""
        raise CommentError(
            f"GitHub answered {response.status} to {response.method} {response.url.path}: "
            f"{said!r}{why}",
            code,
        )
    return await response.json()


async def _ours(session: aiohttp.ClientSession, target: Target) -> int | None:
    """The id of our comment on the pull request, following every page."""
    url: str | None = target.comments_url
    params: dict[str, str] | None = {"per_page": "100"}
    while url is not None:
        async with session.get(url, params=params, headers=target.headers()) as response:
            comments = await _checked(response)
            following = response.links.get("next")
            url = str(following["url"]) if following else None
            params = None  # the next page's URL carries them
        for comment in comments:
            if MARKER in str(comment.get("body") or ""):
                return int(comment["id"])
    return None


async def post_comment(target: Target, body: str) -> str:
    """Update our comment, else create it; what was done, with the comment's URL."""
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        found = await _ours(session, target)
        if found is not None:
            url = f"{target.api_url}/repos/{target.repository}/issues/comments/{found}"
            async with session.patch(url, json={"body": body}, headers=target.headers()) as r:
                done = await _checked(r)
            return f"updated {done.get('html_url', found)}"
        async with session.post(
            target.comments_url, json={"body": body}, headers=target.headers()
        ) as response:
            done = await _checked(response)
        return f"posted {done.get('html_url', done.get('id'))}"


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m agenttest_submit.commands.github_comment BODY.md", file=sys.stderr)
        return 2
    try:
        markdown = Path(args[0]).read_text(encoding="utf-8")
        target = target_from(environ)
        if target is None:
            print("agenttest: not a pull request: no comment posted", file=sys.stderr)
            return 0
        said = asyncio.run(post_comment(target, comment_body(markdown)))
    except (aiohttp.ClientError, TimeoutError) as exc:
        print(f"agenttest: GitHub out of reach: {exc!r}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"agenttest: cannot read {args[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except CommentError as exc:
        print(f"agenttest: {exc}", file=sys.stderr)
        return exc.code
    print(f"agenttest: {said}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
