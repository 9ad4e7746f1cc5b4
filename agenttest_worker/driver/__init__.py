"""The conversation driver: plays a conversation's steps over a store.

One code path serves the embedded runner and the Celery turn task: `step` loads a
conversation, runs one engine step, and saves it with the guarded idempotent save;
`budget` counts a run's tokens and cost; `rejudge` judges a stored conversation again;
`event_loops` gives each worker thread its own event loop for agent calls.

Importing it imports no SQLAlchemy: the store it is handed brings its own.
"""

from agenttest_worker.driver.budget_counting import budget_spent
from agenttest_worker.driver.human_reply import answer_human
from agenttest_worker.driver.loop_step import TurnAddress, inline, run_step
from agenttest_worker.driver.rejudge import reevaluate
from agenttest_worker.driver.run_cache import options_of
from agenttest_worker.driver.run_cancels import RUN_CANCELS
from agenttest_worker.driver.span_intake import receive_spans, stored_spans
from agenttest_worker.driver.step import (
    Advance,
    PoolCache,
    end_refused,
    run_step_sync,
)

__all__ = [
    "RUN_CANCELS",
    "Advance",
    "PoolCache",
    "TurnAddress",
    "answer_human",
    "budget_spent",
    "end_refused",
    "inline",
    "options_of",
    "receive_spans",
    "reevaluate",
    "run_step",
    "run_step_sync",
    "stored_spans",
]
