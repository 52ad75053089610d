"""The page's "What the model reads" comes from the server, rendered by the schedulers' own
function: for a real TextArena episode it is, character for character, the user messages an
`OpenEnvScheduler` gives the model for the same seed and replies (the page itself, in a real
browser: tests/web/test_browser.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from envsdk.client import EnvClient
from envsdk.env import RolloutRequest
from envsdk.schedulers import OpenEnvScheduler

pytestmark = pytest.mark.timeout(120)

REPLIES = ["[3]", "[6]", "[9]"]


class Replies:
    def __init__(self) -> None:
        self.turn = 0

    async def act(self, messages: list[dict[str, Any]]) -> str:
        self.turn += 1
        return REPLIES[self.turn - 1]


async def test_the_page_shows_exactly_what_the_scheduler_gives_the_model(textarena_url: str) -> None:
    [traj] = await OpenEnvScheduler(max_turns=len(REPLIES)).run(
        [RolloutRequest(data_dict={"env_config": {"base_url": textarena_url, "seed": 5}})], Replies()
    )
    given = [m["content"] for m in traj.messages if m["role"] == "user"]
    # The page plays the same episode over /ws, then asks the server what the model reads.
    async with EnvClient(textarena_url) as env:
        observations = [(await env.reset(seed=5)).observation]
        for reply in REPLIES:
            observations.append((await env.step({"message": reply})).observation)
    shown = []
    async with httpx.AsyncClient(base_url=textarena_url, timeout=30) as http:
        previous = None
        for obs in observations:
            reply = await http.post("/web/api/model_view", json={"observation": obs, "previous": previous})
            assert reply.status_code == 200, reply.text
            shown.append(reply.json()["text"])
            previous = obs
        as_json = await http.post("/web/api/model_view", json={"observation": observations[0], "formatter": "json"})
        unknown = await http.post("/web/api/model_view", json={"observation": {}, "formatter": "os:system"})
    assert shown == given and len(given) == len(REPLIES) + 1
    assert as_json.json()["text"].startswith('{"')
    assert unknown.status_code == 422 and "known: json, text" in unknown.text

