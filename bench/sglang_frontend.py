"""Run an SGLang frontend-language program, unchanged, against the auction server.

Runs in the separate SGLang virtualenv made by ``bench/setup_sglang_reference.sh`` (nothing
here imports the project); ``bench/run_sglang_frontend.sh`` starts a server and runs it::

    python bench/sglang_frontend.py BASE_URL API_KEY

What it runs, with ``sgl.RuntimeEndpoint(BASE_URL, api_key=API_KEY)`` as the backend:

1. ``gen``: one program, one generation (``RuntimeEndpoint`` first calls ``/get_model_info``,
   then ``/generate`` with ``sampling_params.stop_regex`` among the parameters);
2. ``run_batch`` of 4 programs, each with two ``gen`` calls;
3. ``select``: the frontend asks for the logprobs of every choice in one batched request,
   which the server refuses: in front of the emulator with a 400 naming ``return_logprob``
   (it has no model to score tokens with), in front of a real SGLang as a batched request
   (one bid is for one prompt); the script checks that the refusal says so and exits 0.

Any other failure exits non-zero. No request carries a bid: a missing bid is 0.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

try:  # run as a module of the repository (type checks, tests)
    from bench import torchvision_stub
except ImportError:  # run as a script in SGLang's virtualenv, where bench/ is on sys.path
    import torchvision_stub  # type: ignore[no-redef, import-not-found]


def answer(s: Any, question: str) -> None:
    """One question, one generation."""
    s += "Q: " + question + "\nA:"
    s += _sgl().gen("answer", max_tokens=16, stop="\n")


def two_steps(s: Any, topic: str) -> None:
    """Two generations in one program."""
    s += "Topic: " + topic + "\nOutline:"
    s += _sgl().gen("outline", max_tokens=12)
    s += "\nSummary:"
    s += _sgl().gen("summary", max_tokens=8, temperature=0)


def choose(s: Any, question: str) -> None:
    """A choice between two answers, by their logprobs."""
    s += "Q: " + question + "\nA:"
    s += _sgl().select("verdict", choices=[" yes", " no"])


def _sgl() -> Any:
    return importlib.import_module("sglang")  # only in SGLang's virtualenv, after the stub


def main() -> None:
    """Run the three programs and check their results."""
    base_url, api_key = sys.argv[1], sys.argv[2]
    torchvision_stub.install()
    sgl = _sgl()
    sgl.set_default_backend(sgl.RuntimeEndpoint(base_url, api_key=api_key))

    state = sgl.function(answer).run(question="What does an auction decide?")
    print(f"gen: {state['answer']!r}")

    topics = ["prefix caches", "priority queues", "VCG payments", "budgets"]
    states = sgl.function(two_steps).run_batch([{"topic": topic} for topic in topics])
    for topic, batch_state in zip(topics, states, strict=True):
        outline, summary = batch_state["outline"], batch_state["summary"]
        print(f"run_batch: {topic}: {outline!r} / {summary!r}")
        if not isinstance(summary, str):
            sys.exit(f"run_batch: no summary for {topic}")

    # The interpreter keeps a failed call's error on the program state instead of raising it.
    state = sgl.function(choose).run(question="Is the sky blue?")
    error = state.error()
    if error is None:
        print(f"select: {state['verdict']!r}")
        return
    text = str(error)
    # In front of the emulator: no logprobs at all. In front of a real SGLang, which computes
    # them: `select` still asks for all its choices in one batched request, one bid for many
    # prompts, which the auction refuses.
    emulator = "return_logprob" in text and "select" in text
    batched = "one prompt per request" in text
    if not (emulator or batched):
        sys.exit(f"select: refused without saying why: {text}")
    print(f"select: refused as documented: {text[:200]}...")


if __name__ == "__main__":
    main()
