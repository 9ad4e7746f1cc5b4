"""A stand-in of GitHub's REST API for issue comments, as the PR comment uses it:
list (paginated with a Link header, as GitHub does), create, update. It refuses a
request without `Authorization: Bearer <token>` (401) or with a token that may not
write (403), and checks that a body is a JSON object with a string `body`.

    with GitHubStandIn(token="t0ken") as api:
        api.add("o/r", 7, "someone else's comment")
        ... GITHUB_API_URL=api.url ...
        api.comments("o/r", 7)     # the bodies, in order
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Self

from aiohttp import web

from agenttest_worker.demo.threaded import ThreadedServer


class GitHubStandIn:
    def __init__(self, token: str, *, read_only: bool = False) -> None:
        self.token = token
        self.read_only = read_only
        self._lock = threading.Lock()
        self._ids = itertools.count(1001)
        # (repository, number) -> [{"id", "body", "user"}]
        self._issues: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadedServer(self._app, name="github-standin")

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> Self:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def add(self, repository: str, number: int, body: str) -> int:
        with self._lock:
            comment = {"id": next(self._ids), "body": body, "user": {"login": "someone"}}
            self._issues.setdefault((repository, number), []).append(comment)
            return int(comment["id"])

    def comments(self, repository: str, number: int) -> list[str]:
        with self._lock:
            return [c["body"] for c in self._issues.get((repository, number), [])]

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        path = "/repos/{owner}/{name}/issues"
        app.router.add_get(path + "/{number:\\d+}/comments", self._list)
        app.router.add_post(path + "/{number:\\d+}/comments", self._create)
        app.router.add_patch(path + "/comments/{id:\\d+}", self._update)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"message": "Bad credentials"}, status=401)
        if self.read_only and request.method != "GET":
            message = "Resource not accessible by integration"
            return web.json_response({"message": message}, status=403)
        return await handler(request)

    def _key(self, request: web.Request) -> tuple[str, int]:
        info = request.match_info
        return f"{info['owner']}/{info['name']}", int(info["number"])

    def _shown(self, comment: dict[str, Any]) -> dict[str, Any]:
        return {**comment, "html_url": f"https://github.test/comment/{comment['id']}"}

    async def _list(self, request: web.Request) -> web.Response:
        per_page = int(request.query.get("per_page", "30"))
        page = int(request.query.get("page", "1"))
        with self._lock:
            everything = list(self._issues.get(self._key(request), []))
        shown = everything[(page - 1) * per_page : page * per_page]
        headers = {}
        if page * per_page < len(everything):
            following = request.url.update_query(page=str(page + 1), per_page=str(per_page))
            headers["Link"] = f'<{following}>; rel="next"'
        return web.json_response([self._shown(c) for c in shown], headers=headers)

    async def _body(self, request: web.Request) -> str | web.Response:
        sent = await request.json()
        if not isinstance(sent, dict) or not isinstance(sent.get("body"), str):
            return web.json_response({"message": "body is required"}, status=422)
        return str(sent["body"])

    async def _create(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        key = self._key(request)
        with self._lock:
            comment = {"id": next(self._ids), "body": body, "user": {"login": "github-actions"}}
            self._issues.setdefault(key, []).append(comment)
        return web.json_response(self._shown(comment), status=201)

    async def _update(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        wanted = int(request.match_info["id"])
        with self._lock:
            for comments in self._issues.values():
                for comment in comments:
                    if comment["id"] == wanted:
                        comment["body"] = body
                        return web.json_response(self._shown(comment))
        return web.json_response({"message": "Not Found"}, status=404)
