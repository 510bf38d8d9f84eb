"""The name of the model this server serves, and the check OpenAI requests' `model` gets.

The name is the `model_name` setting when set, else what the engine states (SGLang's
`served_model_name`, read again when the engine restarts; the emulator's own name). Clients
sent to this server by OpenAI habit name a model in every request: a name the server does not
serve is answered 404 `model_not_found`, as OpenAI answers it, so a request meant for another
model is never served by this one. A missing `model`, and SGLang's placeholder `default`,
mean the one model served, as SGLang reads them.
"""

from __future__ import annotations

from inference_auctions.server.api.deps import AppState
from inference_auctions.server.errors import ModelNotFound

__all__ = ["UNSTATED_MODEL_NAME", "check_model", "served_model"]

# The model's name while an engine at a URL has not stated it yet (it has not answered).
UNSTATED_MODEL_NAME = "default"
# SGLang's OpenAI layer names the model `default` when a request leaves it out.
_ANY_MODEL = frozenset({"default"})


def served_model(state: AppState) -> str:
    """The model name answers and `/v1/models` carry."""
    return state.settings.model_name or state.service.engine_model_name or UNSTATED_MODEL_NAME


def check_model(state: AppState, requested: str | None) -> None:
    """`ModelNotFound` unless `requested` names the model served (or none)."""
    if requested is None or requested in _ANY_MODEL:
        return
    names = {state.settings.model_name, state.service.engine_model_name} - {None}
    if not names or requested in names:  # an engine that has not said yet: nothing to compare
        return
    raise ModelNotFound(
        f"the model {requested!r} is not served here; this server serves {served_model(state)!r}"
        " (see /v1/models)",
        param="model",
    )
