"""The viewer's aiohttp application: pages and their JSON API, read-only but for labels.

    /                       the runs, grouped, newest first
    /runs/RUN               a run: summary, live progress while it runs, the case table
    /runs/RUN/case?id=ID    a case's conversation (every repetition of a repeated case)
    /runs/RUN/diff?base=B   what changed since B (a run id, last, or suite: the default)
    /compare?a=A&b=B        any two runs compared: their cases by change
    /compare?run=R&a=A&b=B  two targets of run R compared, A | B
    /compare/case?a=&b=&id= one case of both runs side by side, turn by turn
    /api/runs               {"groups": [{"name", "runs": [...], "trend": [...]}]}
    /api/compare?a=&b=      the `diff` command's JSON from A to B, rows joined, labels
    /api/compare?run=&a=&b= the same of two targets of one run (`diff RUN --targets A B`)
    /api/compare/labels?a=&b= only the two sides' labels and runs
    /api/runs/RUN           the run's header, summary and progress
    /api/runs/RUN/cases     {"rows": [...]} (?q=TEXT: {"ids": [...]} of the cases matching)
    /api/runs/RUN/case?id=  {"exists", "row", "records": [[record, notes], ...]}
    /api/runs/RUN/diff?base= the `diff` command's JSON, case by case
    POST /api/runs/RUN/labels  a person's pass or fail for one judged assertion
                            ({"case", "turn" (a number or "final"), "label": "pass" or
                            "fail", "note", "assertion", "by"}), as `label` keeps it

Every request passes `guard` first: only GET and HEAD are served, and POST to the one
path that writes (anything else is 405 before routing, so no other handler can be
reached by a method that might change something). A POST must be JSON
(`Content-Type: application/json`, which no cross-site form can send without the
browser asking first, and this server never allows it) and, when the browser says
where it comes from (`Origin`, `Sec-Fetch-Site`), come from the viewer's own pages: a
page elsewhere cannot label through a visitor's browser, even one that holds the token;
with a token, the request must carry it (`Authorization: Bearer TOKEN`, or basic auth
with TOKEN as the password, which a browser asks for); without one the server is on a
loopback address and answers only requests addressed to one, so that a web page the
browser visits cannot reach it through a DNS name rebound to 127.0.0.1. Every response
carries a Content-Security-Policy and nosniff; the token is never part of a page.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agenttest_submit.cli.request import LabelRequest
from agenttest_submit.commands.judge_labelling import label_verdict
from agenttest_submit.commands.viewer.analysis import (
    compare,
    compare_targets,
    pair_labels,
    trends,
)
from agenttest_submit.commands.viewer.queries import RunViews, run_diff, runs_page
from agenttest_worker.errors import InputError
from agenttest_worker.observe import authorized
from agenttest_worker.report import page_end, page_start, policy

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_RUN = "{run:[A-Za-z0-9._-]{1,64}}"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
_API_POLICY = "default-src 'none'; frame-ancestors 'none'"
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_HOST_PORT = re.compile(r"^(\[[^\]]*\]|[^:]*)(:\d+)?$")
_LABELS = re.compile(r"^/api/runs/[A-Za-z0-9._-]{1,64}/labels$")
VIEWS = web.AppKey("views", RunViews)


def make_app(url: str, *, token: str | None = None, host: str = "127.0.0.1") -> web.Application:
    """The viewer over the store at `url`, listening on `host`; `token`: what every
    request must carry. Without a token, a request must name a loopback host or the
    address the viewer was bound to (`--host 127.0.0.2`) in its Host header."""
    bound = _host(host if not (":" in host and not host.startswith("[")) else f"[{host}]")
    app = web.Application(middlewares=[_guard(token, {*_LOOPBACK_HOSTS, bound})])
    app[VIEWS] = RunViews(url)
    app.router.add_get("/", _page("runs"))
    app.router.add_get(f"/runs/{_RUN}", _page("run"))
    app.router.add_get(f"/runs/{_RUN}/case", _page("case"))
    app.router.add_get(f"/runs/{_RUN}/diff", _page("diff"))
    app.router.add_get("/compare", _page("compare"))
    app.router.add_get("/compare/case", _page("pair"))
    app.router.add_get("/api/compare", _api_compare)
    app.router.add_get("/api/compare/labels", _api_compare)
    app.router.add_get("/api/runs", _api_runs)
    app.router.add_get(f"/api/runs/{_RUN}", _api_run)
    app.router.add_get(f"/api/runs/{_RUN}/cases", _api_cases)
    app.router.add_get(f"/api/runs/{_RUN}/case", _api_case)
    app.router.add_get(f"/api/runs/{_RUN}/diff", _api_diff)
    app.router.add_post(f"/api/runs/{_RUN}/labels", _api_label)
    return app


def _guard(token: str | None, hosts: set[str]) -> Any:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            writes = request.method == "POST" and bool(_LABELS.match(request.path))
            if request.method not in ("GET", "HEAD") and not writes:
                raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"], text="read-only")
            if token is not None:
                if not authorized(request.headers.get("Authorization", ""), token):
                    raise web.HTTPUnauthorized(
                        headers={"WWW-Authenticate": 'Basic realm="agenttest", charset="UTF-8"'},
                        text="a token is required",
                    )
            elif _host(request.host) not in hosts:
                # A page elsewhere reaching this address through a rebound DNS name
                # sends its own name as Host.
                raise web.HTTPMisdirectedRequest(
                    text="this viewer answers only to " + ", ".join(sorted(hosts))
                )
            if writes:
                _same_origin(request)
            response = await handler(request)
        except web.HTTPException as error:
            _secure(request, error)
            raise
        _secure(request, response)
        return response

    return guard


def _same_origin(request: web.Request) -> None:
    """A write comes as JSON from the viewer's own pages (see the module docstring)."""
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(text="a label is sent as application/json")
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise web.HTTPForbidden(text="labels come from this viewer's own pages")
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        raise web.HTTPForbidden(text="labels come from this viewer's own pages")


def _host(header: str) -> str:
    match = _HOST_PORT.match(header.strip().lower())
    return match.group(1) if match else ""


def _secure(request: web.Request, response: web.StreamResponse) -> None:
    page = not request.path.startswith("/api/")
    response.headers["Content-Security-Policy"] = (
        f"{policy(served=True)}; frame-ancestors 'none'" if page else _API_POLICY
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Cache-Control"] = "no-store"


def _page(kind: str) -> Handler:
    async def page(request: web.Request) -> web.StreamResponse:
        config: dict[str, Any] = {"page": kind}
        title = "agenttest"
        if kind in ("compare", "pair"):
            config["a"], config["b"] = request.query.get("a", ""), request.query.get("b", "")
            if kind == "compare" and request.query.get("run"):
                config["run"] = request.query["run"]  # two targets of one run
            config["case"] = request.query.get("id", "")
            title = "agenttest · compare"
        elif kind != "runs":
            config["run"] = request.match_info["run"]
            title = f"agenttest · run {config['run']}"
        if kind == "case":
            config["case"] = request.query.get("id", "")
        if kind == "diff":
            config["base"] = request.query.get("base", "suite")
        # The page is the same shell as the HTML report's; its data comes from /api/.
        text = page_start(title, config, served=True) + page_end()
        return web.Response(text=text, content_type="text/html", charset="utf-8")

    return page


def _views(request: web.Request) -> RunViews:
    return request.app[VIEWS]


async def _read(function: Callable[..., Any], *args: Any) -> Any:
    # The store is synchronous (SQLAlchemy): read on a thread, the loop stays free.
    return await asyncio.to_thread(function, *args)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status)


def _no_run(request: web.Request) -> web.Response:
    return _json({"message": f"no run {request.match_info['run']}"}, status=404)


def _runs_with_trends(url: str) -> dict[str, Any]:
    found = runs_page(url)
    trends(url, found["groups"])
    return found


async def _api_runs(request: web.Request) -> web.StreamResponse:
    return _json(await _read(_runs_with_trends, _views(request).url))


async def _api_compare(request: web.Request) -> web.StreamResponse:
    a, b = request.query.get("a", ""), request.query.get("b", "")
    run = request.query.get("run")
    if run is not None and not request.path.endswith("/labels"):
        # Two targets of one run: a and b name targets, not runs.
        if not (_RUN_ID.fullmatch(run) and a and b):
            return _json({"message": "pick a run and two targets (?run=RUN&a=A&b=B)"}, status=404)
        found = await _read(compare_targets, _views(request), run, a, b)
        if found is None:
            return _json({"message": f"no run {run}"}, status=404)
        return _json(found, status=404 if "cases" not in found else 200)
    if not (_RUN_ID.fullmatch(a) and _RUN_ID.fullmatch(b)):
        return _json({"message": "pick two runs to compare (?a=RUN&b=RUN)"}, status=404)
    if request.path.endswith("/labels"):
        found = await _read(pair_labels, _views(request).url, a, b)
    else:
        found = await _read(compare, _views(request), a, b)
    if found is None:
        return _json({"message": f"no run {a} or no run {b}"}, status=404)
    return _json(found)


async def _api_run(request: web.Request) -> web.StreamResponse:
    found = await _read(_views(request).header, request.match_info["run"])
    return _no_run(request) if found is None else _json(found)


async def _api_cases(request: web.Request) -> web.StreamResponse:
    run = request.match_info["run"]
    query = request.query.get("q", "").strip()
    if query:
        ids = await _read(_views(request).search, run, query)
        return _no_run(request) if ids is None else _json({"ids": ids})
    rows = await _read(_views(request).rows, run)
    return _no_run(request) if rows is None else _json({"rows": rows})


async def _api_case(request: web.Request) -> web.StreamResponse:
    found = await _read(
        _views(request).case, request.match_info["run"], request.query.get("id", "")
    )
    if found is None:
        return _no_run(request)
    return _json(found, status=200 if found["exists"] else 404)


async def _api_diff(request: web.Request) -> web.StreamResponse:
    base = request.query.get("base", "suite")
    found = await _read(run_diff, _views(request).url, request.match_info["run"], base)
    if found is None:
        return _no_run(request)
    return _json(found, status=404 if "cases" not in found else 200)


def _label_request(run: str, body: Any) -> LabelRequest | str:
    """The label a POST's JSON asks for, or what is wrong with it."""
    if not isinstance(body, dict):
        return "a label is a JSON object"
    case, turn, label = body.get("case"), body.get("turn"), body.get("label")
    note, assertion, by = body.get("note"), body.get("assertion"), body.get("by")
    if not isinstance(case, str) or not case:
        return "case: the case's id"
    if turn == "final":
        turn = 0
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
        return 'turn: a turn number, or "final"'
    if label not in ("pass", "fail"):
        return 'label: "pass" or "fail"'
    if note is not None and (not isinstance(note, str) or len(note) > 4000):
        return "note: text (at most 4000 characters)"
    if assertion is not None and (not isinstance(assertion, int) or assertion < 1):
        return "assertion: the assertion's position in its turn, from 1"
    if by is not None and (not isinstance(by, str) or len(by) > 200):
        return "by: a name (at most 200 characters)"
    return LabelRequest(run, case, turn, label == "pass", note, assertion, by)


async def _api_label(request: web.Request) -> web.StreamResponse:
    run = request.match_info["run"]
    try:
        body = await request.json()
    except ValueError:
        return _json({"message": "the body is not JSON"}, status=400)
    asked = _label_request(run, body)
    if isinstance(asked, str):
        return _json({"message": asked}, status=400)
    if await _read(_views(request).header, run) is None:
        return _no_run(request)
    try:
        kept = await _read(label_verdict, _views(request).url, run, asked)
    except InputError as error:
        return _json({"message": "; ".join(p.message for p in error.problems)}, status=400)
    return _json(
        {
            "case": kept.case_id,
            "turn": kept.turn,
            "assertion": kept.position,
            "criterion": kept.criterion,
            "judge_verdict": "pass" if kept.judge_verdict else "fail",
            "label": "pass" if kept.label else "fail",
        },
        status=201,
    )
