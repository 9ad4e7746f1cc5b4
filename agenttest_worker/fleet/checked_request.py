"""Celery's task request, refusing a message it cannot be built from as an invalid task.

Report upstream (Celery 5.6, 5.7, worker/request.py): `Request.__init__` unpacks the
body and reads headers unchecked, so a message naming a registered task with a body
that is not `[args, kwargs, embed]` (`[]`, say) or a malformed header (`timelimit: [1]`)
raises a ValueError or TypeError out of the consumer, which is fatal to the worker; only
InvalidTaskError, ContentDisallowed and DecodeError are handled there (the message is
logged and dropped). Any broker carries such a message: a RabbitMQ body, a Redis item.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker.request import Request


class CheckedRequest(Request):  # type: ignore[misc]
    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(message, *args, **kwargs)
            # Read only once the task runs (execute_using_pool), and unpacked there.
            _time_limit, _soft_time_limit = self.time_limits
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # Celery's consumer logs an InvalidTaskError and rejects the message.
            raise InvalidTaskError(f"a task message Celery cannot read: {exc!r}") from exc
