"""`agenttest-submit label RUN CASE TURN pass|fail [--note TEXT] [--assertion K]`: a
person's verdict on one judged assertion of a stored run, kept beside the judge's.

The same check and write serve the viewer's label button (viewer/web_app.py): the
conversation must be the run's, the turn one it played (or `final`), and the assertion
an agent assertion; when the turn has one agent assertion, K may be left out.
"""

from __future__ import annotations

from agenttest_submit.cli.request import LabelRequest
from agenttest_worker.engine import ConversationState
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import FINAL_TURN, judged_at, printable
from agenttest_worker.results import AssertionResult
from agenttest_worker.store import judge_labels, runs, stored_conversations


def _problem(message: str, field: str) -> InputError:
    return InputError(InputProblem(message, field=field))


def _assertions(state: ConversationState, turn: int) -> list[AssertionResult] | None:
    if turn == FINAL_TURN:
        return list(state.final_assertions)
    played = next((t for t in state.turns if t.turn == turn), None)
    return None if played is None else list(played.assertions)


def label_verdict(url: str, run_id: str, request: LabelRequest) -> judge_labels.StoredLabel:
    """Keep the label `request` gives, after checking what it names; the label kept."""
    found = stored_conversations(url, [request.case_id], run_id).get(request.case_id)
    if found is None:
        raise _problem(
            f"run {run_id} has no finished conversation {printable(request.case_id)!r}", "CASE"
        )
    state = ConversationState.model_validate(found.state)
    assertions = _assertions(state, request.turn)
    if assertions is None:
        raise _problem(f"{printable(request.case_id)} has no turn {request.turn}", "TURN")
    judged = [i for i, a in enumerate(assertions, start=1) if a.type == "agent"]
    position = request.assertion
    if position is None:
        if len(judged) != 1:
            where = "its final assertions" if request.turn == FINAL_TURN else "that turn"
            which = ", ".join(map(str, judged)) or "none"
            raise _problem(
                f"{where} has {len(judged)} judged assertions (at {which}): say which with "
                "--assertion K",
                "--assertion",
            )
        position = judged[0]
    if position not in judged:
        raise _problem(
            f"assertion {position} of that turn is not a judged (agent) assertion", "--assertion"
        )
    assertion = assertions[position - 1]
    judged_then = judged_at(assertion, None)
    if judged_then.verdict is None:
        raise _problem("that assertion's judge gave no verdict (its call failed)", "TURN")
    label = judge_labels.StoredLabel(
        case_id=request.case_id,
        turn=request.turn,
        position=position,
        criterion=judged_then.criterion,
        judge_verdict=judged_then.verdict,
        label=request.label,
        note=request.note,
        labelled_by=request.by if request.by is not None else runs.submitted_by(),
    )
    judge_labels.add_label(url, run_id, label)
    return label


def label_command(url: str, run_id: str, request: LabelRequest) -> int:
    label = label_verdict(url, run_id, request)
    where = "final" if label.turn == FINAL_TURN else f"turn {label.turn}"
    judged = "pass" if label.judge_verdict else "fail"
    said = "pass" if label.label else "fail"
    agrees = "agrees with" if label.judge_verdict == label.label else "disagrees with"
    print(
        f"labelled {printable(label.case_id)} {where} assertion {label.position} "
        f"({printable(label.criterion)}): {said}, which {agrees} the judge's {judged}"
    )
    return 0
