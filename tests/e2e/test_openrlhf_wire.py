"""OpenRLHF's remote reward model client against our `/get_reward`, checked against the peer's
own source (issue 43, item 1: compatibility by the peer's schema, not by our client).

What OpenRLHF's client does, read in its `openrlhf/utils/remote_rm_utils.py` (OpenRLHF/OpenRLHF
9b8641c; 07c34b3 is the older form): `remote_rm_fn` POSTs ``{"query": queries, "prompts":
prompts, "labels": labels}`` as JSON (the older form ``{"query": queries}`` alone), with
``Content-Type: application/json``; `request_api_wrapper` calls ``raise_for_status()``, reads
``response.json()``, asserts ``score_key in response`` with ``score_key="rewards"`` by default,
and `remote_rm_fn` returns ``torch.tensor(response["rewards"])``. So the answer must be a 2xx
JSON object holding ``rewards``: a flat list of numbers, one per query, in the query's order (a
nested or ragged list, a missing key or a renamed one breaks the trainer). Each reward is the
reward model's own score of the query text (OpenRLHF's query is prompt and response together),
computed here apart with plain transformers on the real tiny model the service holds.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

QUERIES = ["Question: what is 2 + 2?\nAnswer: 4", "Question: what is 2 + 2?\nAnswer: 5",
           "def add(a, b): return a + b"]
PROMPTS = ["Question: what is 2 + 2?\nAnswer:", "Question: what is 2 + 2?\nAnswer:",
           "Write add."]
LABELS = ["4", "4", ""]


def _reference(path: str, texts: list[str]) -> list[float]:
    """The scalar head's logit on each text alone (the service's default reward model, tiny-rm)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    with torch.inference_mode():
        return [float(model(**tok(t, return_tensors="pt")).logits[0][0]) for t in texts]


@pytest.mark.parametrize("form", ["query, prompts, labels (9b8641c)", "query alone (07c34b3)"])
def test_openrlhfs_remote_rm_client_reads_our_rewards(server: str, model_specs: tuple,
                                                      form: str) -> None:
    import torch

    body: dict[str, Any] = {"query": QUERIES}
    if form.startswith("query, prompts"):
        body |= {"prompts": PROMPTS, "labels": LABELS}
    # what request_api_wrapper does, step by step
    r = httpx.post(f"{server}/get_reward", json=body,
                   headers={"Content-Type": "application/json"}, timeout=180)
    r.raise_for_status()
    response = r.json()
    assert "rewards" in response, response
    scores = torch.tensor(response["rewards"])  # what remote_rm_fn returns to the trainer
    assert scores.shape == (len(QUERIES),) and scores.dtype == torch.float32
    (rm,) = [s for s in model_specs if s.name == "tiny-rm"]
    want = _reference(rm.path, QUERIES)
    assert len({round(x, 4) for x in want}) == len(QUERIES)  # (distinct: the order is pinned)
    assert response["rewards"] == pytest.approx(want, abs=1e-4)
