"""Golden conversations, embedded, through the real CLI against agents over real HTTP.

The target is a ScriptedAgent whose behaviour the test changes between runs (its
wording, the tool it calls); the judge of `match: judge` is the demo "validator"
model. The round trip: record with --update-golden (the file's exact text checked),
compare unchanged, edit the agent, compare with exact, tools and judge.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from browser import IMG, SCRIPT, chromium, not_pwned, open_page
from scripted_agent import Body, Reply, ScriptedAgent, call, last_user_text, say

from agenttest_submit.cli.main import main
from agenttest_worker.assertions import golden_name

TARGET = "travel"
MOCKS = {"search_flights": {"flights": ["AF123"]}, "search_trains": {"trains": []}}


class Travel:
    """Asked for a flight, searches (a mocked tool), then answers; thanked, says bye.
    `wording`, `city` (the search's argument) and `tool` are what a test edits."""

    def __init__(self) -> None:
        self.wording = "I found flight AF123 to Paris."
        self.city = "Paris"
        self.tool = "search_flights"
        # Replies used one by one (then `wording`), one per conversation.
        self.replies: list[str] = []

    def __call__(self, body: Body) -> Reply:
        messages = body["messages"]
        if "flight" in last_user_text(body):
            if messages[-1]["role"] != "tool":
                return call(self.tool, {"to": self.city})
            return say(self.replies.pop(0) if self.replies else self.wording)
        return say("You are welcome. Goodbye!")


@pytest.fixture
def travel() -> Travel:
    return Travel()


@pytest.fixture
def project(
    travel: Travel, demo_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    with ScriptedAgent() as agent:
        agent.script("travel", travel)
        config = {
            "agents": {
                TARGET: agent.entry("travel", max_retries=0),
                "validator": {"protocol": "openai", "base_url": demo_url, "model": "validator"},
            },
            "defaults": {"judge": "validator"},
        }
        (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        yield tmp_path


def trip(*final: dict[str, Any], case_id: str = "G1") -> dict[str, Any]:
    return {
        "id": case_id,
        "turns": [{"input": "a flight to Paris please"}, {"input": "thanks"}],
        "tool_mocks": MOCKS,
        "final_assertions": list(final),
    }


def write(project: Path, cases: list[dict[str, Any]]) -> Path:
    source = project / "cases.jsonl"
    source.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return source


def run(
    project: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, dict[str, Any], str, str]:
    """(exit code, records by id, stdout, stderr) of an embedded run of cases.jsonl."""
    capsys.readouterr()
    code = main(["-i", "cases.jsonl", "-n", TARGET, *args, "--format", "jsonl"])
    out, err = capsys.readouterr()
    records = {r["id"]: r for r in map(json.loads, out.splitlines()) if r.get("id")}
    return code, records, out, err


def golden_of(records: dict[str, Any], case_id: str) -> dict[str, Any]:
    [found] = [a for a in records[case_id]["final_assertions"] if a["type"] == "golden"]
    return found


GOLDEN_G1 = """{
  "id": "G1",
  "turns": [
    {
      "input": "a flight to Paris please",
      "reply": "I found flight AF123 to Paris.",
      "tool_calls": [
        {
          "args": {
            "to": "Paris"
          },
          "name": "search_flights"
        }
      ]
    },
    {
      "input": "thanks",
      "reply": "You are welcome. Goodbye!",
      "tool_calls": []
    }
  ],
  "version": 1
}
"""


def test_the_round_trip_records_then_compares_exact_tools_and_judge(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project,
        [
            trip({"type": "golden", "match": "exact"}),
            trip({"type": "golden", "match": "tools"}, case_id="G2"),
            trip({"type": "golden", "match": "judge"}, case_id="G3"),
            {
                "id": "F",
                "input": "a flight please",
                "assertions": [{"type": "contains", "value": "Rome"}],
                "tool_mocks": MOCKS,
            },
        ],
    )
    # Recording: the golden assertions are left out, the failing case is not recorded.
    code, records, _, err = run(project, capsys, "--update-golden")
    assert code == 1, err
    assert [a["type"] for a in records["G1"]["final_assertions"]] == []
    folder = project / "cases.jsonl.golden"
    assert sorted(p.name for p in folder.iterdir()) == ["G1.json", "G2.json", "G3.json"]
    assert (folder / "G1.json").read_text(encoding="utf-8") == GOLDEN_G1
    assert "golden: 3 conversation(s) recorded" in err
    assert "1 case(s) did not pass" in err

    # Unchanged: every match passes.
    code, records, _, err = run(project, capsys, "--id", "G1", "--id", "G2", "--id", "G3")
    assert code == 0, err
    assert golden_of(records, "G1")["reason"] == (
        "the golden conversation's replies and tool calls (2 turn(s))"
    )
    assert golden_of(records, "G3")["reason"].startswith("the golden conversation's replies, word")

    # The same meaning in other words: exact fails, tools and the judge pass.
    travel.wording = "Good news: I FOUND FLIGHT AF123 TO PARIS. Shall I book it?"
    code, records, _, err = run(project, capsys, "--id", "G1", "--id", "G2", "--id", "G3")
    assert code == 1
    exact = golden_of(records, "G1")
    assert not exact["passed"]
    assert exact["reason"] == (
        "turn 1: the reply differs from the golden one: golden 'I found flight AF123 to "
        "Paris.', new 'Good news: I FOUND FLIGHT AF123 TO PARIS. Shall I book it?'"
    )
    assert golden_of(records, "G2")["passed"]
    judged = golden_of(records, "G3")
    assert judged["passed"], judged
    assert "turn(s) 1 judged" in judged["reason"]

    # Another meaning and another search: all three fail, each saying why.
    travel.wording = "Sorry, nothing to Paris today."
    travel.city = "Lyon"
    code, records, _, _ = run(project, capsys, "--id", "G1", "--id", "G2", "--id", "G3")
    assert code == 1
    assert not golden_of(records, "G1")["passed"]
    tools = golden_of(records, "G2")
    assert not tools["passed"]
    assert tools["reason"] == (
        'tool call 1 should be search_flights({"to": "Paris"}), was search_flights({"to": '
        '"Lyon"}); golden: search_flights({"to": "Paris"}); new: search_flights({"to": "Lyon"})'
    )
    judged = golden_of(records, "G3")
    assert not judged["passed"]
    assert judged["reason"].startswith(
        "turn 1: the judge finds it does not mean the same as the golden reply: "
    )
    assert "I found flight AF123 to Paris." in judged["reason"]


def test_args_ignore_compares_only_the_tools_names(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project, [trip({"type": "golden", "match": "tools", "args": "ignore"})])
    assert run(project, capsys, "--update-golden")[0] == 0
    travel.city = "Lyon"
    code, records, _, _ = run(project, capsys)
    assert code == 0 and golden_of(records, "G1")["passed"]
    travel.tool = "search_trains"
    code, records, _, _ = run(project, capsys)
    assert code == 1
    assert golden_of(records, "G1")["reason"].startswith(
        "tool call 1 should be search_flights, was search_trains"
    )


def test_golden_flag_adds_the_assertion_and_says_when_there_is_no_file(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project, [trip(), trip(case_id="new-case")])
    assert run(project, capsys, "--update-golden", "--id", "G1")[0] == 0
    code, records, _, _ = run(project, capsys, "--golden")
    # The case without a golden file fails on its own assertion; the other passes.
    assert code == 1
    assert golden_of(records, "G1")["passed"]
    assert golden_of(records, "G1")["match"] == "tools"
    missing = golden_of(records, "new-case")
    assert not missing["passed"]
    where = "cases.jsonl.golden/new-case.json"
    assert missing["reason"] == (
        f"no golden conversation at {where}: record one with --update-golden"
    )
    assert records["new-case"]["turns"][0]["status"] == "passed"
    travel.wording = "Something else entirely."
    code, records, _, _ = run(project, capsys, "--golden", "exact", "--id", "G1")
    assert code == 1 and golden_of(records, "G1")["match"] == "exact"
    assert not golden_of(records, "G1")["passed"]


def test_the_diff_is_shown_turn_by_turn_in_the_console(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project, [trip({"type": "golden", "match": "exact"})])
    assert run(project, capsys, "--update-golden")[0] == 0
    travel.wording = "Flight \x1b[31mAF999\x1b[0m found."
    capsys.readouterr()
    code = main(["-i", "cases.jsonl", "-n", TARGET])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "Golden | new, turn by turn:" in out, out
    assert "  Turn 1 ≠ reply" in out
    tools = '[tools: search_flights({"to": "Paris"})]'
    assert f'    golden: "I found flight AF123 to Paris." {tools}' in out
    assert f'    new:    "Flight \\u001b[31mAF999\\u001b[0m found." {tools}' in out
    assert "  Turn 2 = the same" in out
    assert "\x1b[31m" not in out


@pytest.mark.parametrize(
    ("assertion", "field", "message"),
    [
        ({"type": "golden", "match": "fuzzy"}, "final_assertions[0].match", "exact"),
        ({"type": "golden", "args": "subset"}, "final_assertions[0].args", "ignore"),
        ({"type": "golden", "use": "judge"}, "final_assertions[0]", "match: judge"),
        ({"type": "golden", "treshold": 1}, "final_assertions[0].treshold", "unknown field"),
    ],
)
def test_a_malformed_golden_assertion_is_refused_by_the_dry_run(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    assertion: dict[str, Any],
    field: str,
    message: str,
) -> None:
    write(project, [{"id": "ok", "input": "hi"}, trip(assertion)])
    capsys.readouterr()
    code = main(["-i", "cases.jsonl", "-n", TARGET, "--dry-run"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in err
    line = next(x for x in err.splitlines() if "cases.jsonl:2" in x)
    assert field in line and message in line, err


def test_golden_in_a_turn_and_a_malformed_golden_file_are_refused_before_anything_runs(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    in_turn = {"id": "T", "input": "hi", "assertions": [{"type": "golden"}]}
    write(project, [in_turn])
    capsys.readouterr()
    assert main(["-i", "cases.jsonl", "-n", TARGET, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "golden compares the whole conversation: put it in final_assertions" in err
    assert "assertions[0].type" in err

    write(project, [trip({"type": "golden"})])
    folder = project / "cases.jsonl.golden"
    folder.mkdir()
    (folder / "G1.json").write_text('{"id": "G1",\n "turns": [{"reply": 3}]}\n', "utf-8")
    assert main(["-i", "cases.jsonl", "-n", TARGET, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "cases.jsonl.golden/G1.json" in err and "turns.0.reply" in err
    (folder / "G1.json").write_text('{"id": "G1",\n "turns": [}\n', "utf-8")
    assert main(["-i", "cases.jsonl", "-n", TARGET, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "G1.json:2" in err and "not JSON" in err


def test_a_hostile_id_cannot_write_outside_the_golden_folder(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = ["../../escaped", "/etc/passwd", "..", ".hidden", "a/b\\c", "é" * 200]
    write(project, [trip(case_id=case_id) for case_id in hostile])
    code, _, _, err = run(project, capsys, "--update-golden")
    assert code == 0, err
    folder = project / "cases.jsonl.golden"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(golden_name(i) for i in hostile)
    assert len(set(names)) == len(hostile)
    assert all("/" not in n and "\\" not in n and not n.startswith(".") for n in names)
    assert all(len(n.encode()) <= 160 for n in names)
    assert golden_name("../../escaped") == "%2E%2E%2F%2E%2E%2Fescaped.json"
    # Nothing was written anywhere else: every JSON file of the project is in the golden
    # folder, and none is beside it or where the ids point.
    written = [p for p in project.rglob("*.json") if p.is_file()]
    assert len(written) == len(hostile) and all(p.parent == folder for p in written)
    assert not list(project.parent.glob("escaped*")) and not Path("/etc/passwd.json").exists()
    # And each is read back by its own case.
    code, records, _, _ = run(project, capsys, "--golden", "exact")
    assert code == 0
    assert all(golden_of(records, i)["passed"] for i in hostile)


def test_the_diff_is_shown_as_text_in_the_html_report(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project, [trip({"type": "golden", "match": "exact"})])
    assert run(project, capsys, "--update-golden")[0] == 0
    travel.wording = f"Flight {SCRIPT} {IMG}"
    travel.city = "Lyon"
    report = project / "report.html"
    code = main(["-i", "cases.jsonl", "-n", TARGET, "--format", "html", "-o", str(report)])
    err = capsys.readouterr().err
    assert code == 1
    run_id = re.search(r"\(run (\S+)\)", err)
    assert run_id, err
    with chromium() as browser:
        page, seen = open_page(browser, f"{report.as_uri()}#case=G1")
        page.wait_for_selector("#conversation table.golden")
        heading = page.inner_text("#conversation .golden-diff h4")
        assert heading == "Golden | new: golden exact"
        rows = [
            [cell.inner_text() for cell in row.query_selector_all("td")]
            for row in page.query_selector_all("#conversation table.golden tbody tr")
        ]
        assert rows[0][0] == "1 ≠ reply, tool calls"
        assert rows[0][1] == 'I found flight AF123 to Paris.\nsearch_flights({"to": "Paris"})'
        assert rows[0][2] == f'Flight {SCRIPT} {IMG}\nsearch_flights({{"to": "Lyon"}})'
        same = "You are welcome. Goodbye!\nno tool calls"
        assert rows[1] == ["2 =", same, same]
        not_pwned(page, f"agenttest · run {run_id.group(1)}")
        assert all(url.startswith(report.as_uri()) for url in seen), seen


def test_a_repeated_case_is_recorded_from_its_first_passing_repetition(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    # One conversation at a time: repetition 1 fails (no AF123), 2 and 3 pass.
    travel.replies = ["No flight found.", "Flight AF123, the second.", "Flight AF123, the third."]
    case = trip()
    case["turns"][0]["assertions"] = [{"type": "contains", "value": "AF123"}]
    write(project, [case])
    code, _, _, err = run(project, capsys, "--update-golden", "--repeat", "3", "--parallel", "1")
    assert code == 1, err
    assert "golden: 1 conversation(s) recorded" in err, err
    recorded = json.loads((project / "cases.jsonl.golden" / "G1.json").read_text("utf-8"))
    assert recorded["turns"][0]["reply"] == "Flight AF123, the second."


def test_a_golden_file_shows_what_a_terminal_would_obey_as_escapes(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    travel.wording = "Paris \u202etxe.exe\x1b[2J é"
    write(project, [trip({"type": "golden", "match": "exact"})])
    assert run(project, capsys, "--update-golden")[0] == 0
    text = (project / "cases.jsonl.golden" / "G1.json").read_text(encoding="utf-8")
    assert '"reply": "Paris \\u202etxe.exe\\u001b[2J é"' in text
    assert "\u202e" not in text and "\x1b" not in text
    code, records, _, _ = run(project, capsys)
    assert code == 0 and golden_of(records, "G1")["passed"]


def test_golden_judge_without_a_judge_and_update_without_wait_are_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project, [trip()])
    config = yaml.safe_load((project / "agenttest.yaml").read_text(encoding="utf-8"))
    del config["defaults"]
    (project / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    capsys.readouterr()
    assert main(["-i", "cases.jsonl", "-n", TARGET, "--golden", "judge"]) == 2
    assert "--golden: judge needs a judge: set defaults.judge" in capsys.readouterr().err
    assert main(["-i", "cases.jsonl", "-n", TARGET, "--update-golden", "--no-wait"]) == 2
    assert "--update-golden: records at the run's end: it needs --wait" in capsys.readouterr().err
    assert main(["-i", "cases.jsonl", "-n", TARGET, "--update-golden", "--golden"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_exact_names_a_turn_whose_tools_differ_and_a_conversation_of_another_length(
    project: Path, travel: Travel, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project, [trip({"type": "golden", "match": "exact"})])
    assert run(project, capsys, "--update-golden")[0] == 0
    travel.tool = "search_trains"
    code, records, _, _ = run(project, capsys)
    assert code == 1
    assert golden_of(records, "G1")["reason"] == (
        'turn 1: the tool calls differ from the golden ones: golden search_flights({"to": '
        '"Paris"}); new search_trains({"to": "Paris"})'
    )
    shorter = trip({"type": "golden", "match": "exact"})
    shorter["turns"] = shorter["turns"][:1]
    write(project, [shorter])
    code, records, _, _ = run(project, capsys, "--golden", "judge")
    assert code == 1
    assert golden_of(records, "G1")["reason"] == (
        "the golden conversation has 2 turn(s), this one 1"
    )
