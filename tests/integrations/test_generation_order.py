"""The rollout function's generation batches are in episode order, whatever order the
environment steps finished in: the sampler draws row by row, so a seeded GRPO run samples the
same tokens for the same episode every time only if row i is always episode i."""

from __future__ import annotations

import asyncio
import queue

import pytest

from envsdk.integrations.trl.rollout_func import _GenerationBatch, _GenerationQueue


@pytest.mark.timeout(10)
def test_a_batch_lists_its_requests_in_episode_order_not_arrival_order() -> None:
    async def main() -> tuple[list[list[int]], list[tuple[list[int], list[float] | None]]]:
        work: queue.Queue[_GenerationBatch | None] = queue.Queue()
        gen = _GenerationQueue(asyncio.get_running_loop(), work)
        for _ in range(4):
            gen.enter()
        # Episodes ask in the order their environment steps finished: 2, 0, 3, 1.
        asks = [asyncio.ensure_future(gen.generate(episode, [episode], 5)) for episode in (2, 0, 3, 1)]
        await asyncio.sleep(0)
        batch = work.get_nowait()
        assert isinstance(batch, _GenerationBatch)
        contexts = [context for context, _, _ in batch.requests]
        # Row i answers the i-th request of the batch: each episode must get its own row back.
        gen.deliver(batch, [([10 + context[0]], None) for context in contexts])
        return contexts, list(await asyncio.gather(*asks))

    contexts, answers = asyncio.run(main())
    assert contexts == [[0], [1], [2], [3]]
    assert answers == [([12], None), ([10], None), ([13], None), ([11], None)]
