"""Schema-driven fuzzing of the HTTP API, against a real server on loopback.

The schema is the server's own `/openapi.json`. For every operation schemathesis generates
requests that follow it and requests that break it (bodies included: the generation and admin
routes read their bodies themselves and publish them through `openapi_extra`). Every answer
must be a deliberate one:

- never a 5xx, and every 4xx is the JSON error object
  `{"error": {"type", "message", "param", "code"}}`;
- a body that breaks the published schema is refused;
- a refused request, and any read, leaves every ledger table exactly as it was;
- after all of it the ledger still reconciles.

The run is bounded (`MAX_EXAMPLES` per operation, a deadline per request) and deterministic
(derandomized generation, a fixed seed). It runs on SQLite only; the access tests cover both
ledger backends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.transport import Response
from schemathesis.specs.openapi.checks import negative_data_rejection
from schemathesis.specs.openapi.schemas import OpenApiSchema

from inference_auctions.server.api.openai_fields import REFUSED
from inference_auctions.server.api.schemas import ChatBody, CompletionBody, GenerateBody
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.security.conftest import ledger_snapshot
from tests.server.harness import RunningServer, running_server

MAX_EXAMPLES = 75
SEED = 20_240_601

# Every operation of the API when this was written; routes added later are fuzzed too, by
# `test_routes_added_after_this_file_are_fuzzed_too`.
OPERATIONS = [
    ("POST", "/generate"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/v1/ledger/balance"),
    ("GET", "/v1/ledger/entries"),
    ("GET", "/v1/ledger/summary"),
    ("GET", "/v1/admin/users"),
    ("POST", "/v1/admin/users"),
    ("POST", "/v1/admin/users/{name}/disable"),
    ("PUT", "/v1/admin/users/{name}/budget"),
    ("GET", "/v1/admin/users/{name}/balance"),
    ("GET", "/v1/admin/reconcile"),
    ("GET", "/v1/admin/timings"),
    ("POST", "/v1/admin/users/{name}/enable"),
    ("POST", "/v1/admin/users/{name}/rotate-key"),
    ("GET", "/v1/admin/users/{name}/keys"),
    ("POST", "/v1/admin/users/{name}/keys"),
    ("DELETE", "/v1/admin/users/{name}/keys/{key_name}"),
    ("PUT", "/v1/admin/users/{name}/limits"),
    ("POST", "/v1/admin/users/{name}/grant"),
    ("POST", "/v1/admin/users/{name}/adjust"),
    ("GET", "/v1/admin/actions"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/model_info"),
    ("GET", "/server_info"),
    ("GET", "/flush_cache"),
    ("POST", "/flush_cache"),
]
ADMIN_ONLY = {path for _, path in OPERATIONS if path.startswith("/v1/admin/")} | {"/flush_cache"}
GENERATION = {"/generate", "/v1/completions", "/v1/chat/completions"}
_BODIES: dict[str, type[BaseModel]] = {
    "/generate": GenerateBody,
    "/v1/completions": CompletionBody,
    "/v1/chat/completions": ChatBody,
}
WITH_BODY = {
    ("POST", "/generate"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/admin/users"),
    ("PUT", "/v1/admin/users/{name}/budget"),
    ("POST", "/v1/admin/users/{name}/keys"),
    ("PUT", "/v1/admin/users/{name}/limits"),
    ("POST", "/v1/admin/users/{name}/grant"),
    ("POST", "/v1/admin/users/{name}/adjust"),
}
# Successful calls of these change the ledger by design; every other call must not.
WRITES = WITH_BODY | {
    ("POST", "/v1/admin/users/{name}/disable"),
    ("POST", "/v1/admin/users/{name}/enable"),
    ("POST", "/v1/admin/users/{name}/rotate-key"),
    ("DELETE", "/v1/admin/users/{name}/keys/{key_name}"),
}

# Valid bids, so that fuzzed requests also get through admission, the auction and settlement.
VALID_BIDS = st.one_of(
    st.decimals(min_value=0, max_value=5, places=6).map(str),
    st.integers(min_value=0, max_value=3),
    st.sampled_from(["0", "0.000001", "2.5", " 1 "]),
)


@dataclass
class Target:
    """The server under fuzzing, its database, the keys it is called with, its schema."""

    server: RunningServer
    db: MigratedDatabase
    user_key: str
    admin_key: str
    schema: OpenApiSchema
    spec: dict[str, Any]
    session: requests.Session


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """One server for the whole module; fuzzing is sequential, so one ledger is enough."""
    with (
        migrated_database("sqlite", tmp_path_factory.mktemp("fuzz")) as db,
        running_server(db, max_wait_ms=2, max_new_tokens_limit=256) as server,
        requests.Session() as session,
    ):
        session.trust_env = False  # loopback only, whatever proxy the environment names
        user_key = server.create_user("fuzz-user", budget=10**13)
        admin_key = server.create_user("fuzz-admin", admin=True)
        spec = session.get(server.url + "/openapi.json", timeout=30).json()
        config = SchemathesisConfig.from_dict(
            {
                "seed": SEED,
                "generation": {"deterministic": True, "database": "none"},
                "max-stream-events": 10_000,  # read every stream to its end
            }
        )
        schema = schemathesis.openapi.from_dict(spec, config=config)
        yield Target(server, db, user_key, admin_key, schema, spec, session)


def _resolve(spec: dict[str, Any], pointer: str) -> Any:
    assert pointer.startswith("#/"), pointer
    node: Any = spec
    for part in pointer[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_the_schema_lists_every_route_and_every_reference_resolves(target: Target) -> None:
    listed = {
        (method.upper(), path)
        for path, operations in target.spec["paths"].items()
        for method in operations
    }
    assert set(OPERATIONS) <= listed
    for ref in _refs(target.spec):
        _resolve(target.spec, ref)  # a dangling reference makes clients drop the body


@pytest.mark.parametrize(("method", "path"), sorted(WITH_BODY))
def test_request_bodies_are_published_and_generated(target: Target, method: str, path: str) -> None:
    operation = target.spec["paths"][path][method.lower()]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["type"] == "object" and body["properties"]
    bodies: list[Any] = []

    @given(target.schema[path][method].as_strategy(GenerationMode.POSITIVE))
    @settings(max_examples=20, derandomize=True, database=None, deadline=None)
    def collect(case: Any) -> None:
        bodies.append(case.body)

    collect()
    assert bodies and all(isinstance(b, dict) for b in bodies), bodies[:3]
    # Different bodies, not one default: the generator really follows the schema's fields.
    assert len({json.dumps(b, sort_keys=True, default=str) for b in bodies}) > 5


def _integral(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer; the API's integer fields take only 3."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_integral(item) for item in value]
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    return value


def _short(body: dict[str, Any], *names: str) -> None:
    for name in names:
        if isinstance(body.get(name), int) and not isinstance(body[name], bool):
            body[name] = abs(body[name]) % 33


def _steer(path: str, case: Any, steer: bool, bid: object) -> Any:
    """Make some generated bodies admissible: a valid bid, short outputs, one prompt; the
    rest of the body stays as generated (unicode, odd sampling parameters, extra keys)."""
    if not steer or path not in GENERATION or not isinstance(case.body, dict):
        return case
    body = _integral(case.body)
    # Only the fields the route reads: any other one is refused by name, before admission.
    model = _BODIES[path]
    known = {field.alias or name for name, field in model.model_fields.items()}
    body = {name: value for name, value in body.items() if name in known}
    body["bid"] = bid
    body.pop("service_tier", None)  # a tier exists only under --pricing tiers: an auction here
    _short(body, "max_tokens", "max_completion_tokens")
    if path == "/generate":
        if isinstance(body.get("sampling_params"), dict):
            _short(body["sampling_params"], "max_new_tokens", "min_new_tokens")
        if isinstance(body.get("text"), list):  # a batch: one of its prompts
            body["text"] = next((t for t in body["text"] if t), None)
        if body.get("text"):
            body.pop("input_ids", None)
        elif not body.get("input_ids"):
            body["text"] = "fuzz"
            body.pop("input_ids", None)
    else:
        # OpenAI's routes: the served model (or none), and none of the fields refused by name.
        body.pop("model", None)
        for name in REFUSED:
            body.pop(name, None)
        for name in ("n", "logprobs", "top_logprobs", "response_format", "tools"):
            body.pop(name, None)  # more than one choice, or what the emulator cannot do
        if isinstance(body.get("messages"), list):  # tool calls: the emulator cannot either
            body["messages"] = [
                {**{k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")},
                 "content": m.get("content") or "fuzz"}
                if isinstance(m, dict) else m
                for m in body["messages"]
            ]  # fmt: skip
        if path == "/v1/completions" and not (
            isinstance(body.get("prompt"), str) and body["prompt"]
        ):
            body["prompt"] = "fuzz"  # one text prompt, as /generate's is made one above
    case.body = body
    return case


def _check_answer(response: Response) -> None:
    status = response.status_code
    assert status < 500, f"{status}: {response.text[:500]}"
    kind = response.headers.get("content-type", [""])[0]
    if status >= 400:
        error = response.json()["error"]
        assert isinstance(error["type"], str) and error["type"] != "internal_error"
        assert isinstance(error["message"], str) and error["message"]
        assert error["param"] is None or isinstance(error["param"], str)
        assert isinstance(error["code"], str) and error["code"] != "internal_error"
    elif kind.startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert not response.stream_cut_short
        assert events[-1] == "[DONE]", response.text[-500:]
        for event in events[:-1]:
            payload = json.loads(event)
            assert payload.get("error", {}).get("type") != "internal_error", payload
    elif kind.startswith("application/json"):
        assert isinstance(response.json(), dict)
    else:  # Prometheus text, SGLang's plain-text answers
        assert kind.startswith("text/plain"), kind


def _fuzz(target: Target, method: str, path: str, *, known: bool) -> list[int]:
    """Fuzz one operation; returns the statuses it answered with."""
    operation = target.schema[path][method]
    positive = operation.as_strategy(GenerationMode.POSITIVE)
    if path in GENERATION:
        positive = st.builds(_steer, st.just(path), positive, st.booleans(), VALID_BIDS)
    strategies = [positive]
    if operation.path_parameters or operation.query or operation.body:
        strategies.append(operation.as_strategy(GenerationMode.NEGATIVE))
    key = target.admin_key if path in ADMIN_ONLY else target.user_key
    # Numeric `since`/`until` query values are read as Unix timestamps (pydantic's datetime
    # parsing), which a strict reading of `format: date-time` calls invalid; bodies have no
    # such leniency, so only they are held to the published schema.
    checks = [not_a_server_error]
    if (method, path) in WITH_BODY:
        checks.append(negative_data_rejection)
    # A route this file does not know may change the ledger when it succeeds.
    may_write = (method, path) in WRITES or not known
    statuses: list[int] = []

    @given(st.one_of(strategies))
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=timedelta(seconds=15),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        # No shrinking: each step is a real request, and a failure reports its case anyway.
        phases=[Phase.explicit, Phase.generate],
    )
    def fuzz(case: Any) -> None:
        before = ledger_snapshot(target.db.engine)
        response = case.call(
            base_url=target.server.url,
            headers={"Authorization": f"Bearer {key}"},
            session=target.session,
            timeout=30,
        )
        statuses.append(response.status_code)
        _check_answer(response)
        case.validate_response(response, checks=checks)
        if response.status_code >= 400 or not may_write:
            assert ledger_snapshot(target.db.engine) == before, (response.status_code, case.body)

    fuzz()
    assert target.server.ledger.reconcile().ok
    return statuses


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_fuzzed_requests_get_deliberate_answers_and_refusals_change_nothing(
    target: Target, method: str, path: str
) -> None:
    statuses = _fuzz(target, method, path, known=True)
    if path in GENERATION:
        # The fuzzing reached admission, the auction and settlement, not only the validators.
        assert sum(200 <= status < 300 for status in statuses) >= 3, statuses
        assert target.server.ledger.balance("fuzz-user").held_micros == 0


def test_routes_added_after_this_file_are_fuzzed_too(target: Target) -> None:
    """Every operation of /openapi.json that OPERATIONS does not name yet, with the same
    checks (a route that succeeds may change the ledger: only its refusals are checked)."""
    for path, operations in target.spec["paths"].items():
        for method in operations:
            if (method.upper(), path) not in OPERATIONS:
                _fuzz(target, method.upper(), path, known=False)
