"""`EnvPool` against real envsdk echo servers on 127.0.0.1: placement, capacity, backoff, resume."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from collections import Counter
from typing import Any

import pytest

from envsdk import EnvClient
from envsdk.client import EnvPool, NoServerAvailableError, PoolSettings, pools
from envsdk.client.pool import is_pool_spec, read_base_urls_file, url_source
from envsdk.env import RolloutRequest
from envsdk.errors import EnvNotFoundError
from envsdk.rollout import add_rollout_parser, run_rollouts
from envsdk.schedulers import OpenEnvScheduler
from envsdk.testing import free_port, running_server

from .conftest import echo_app

pytestmark = pytest.mark.timeout(60)


def active_sessions(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
        return int(json.loads(response.read())["active_sessions"])


async def wait_active(base_url: str, expected: int, timeout: float = 5.0) -> None:
    """Wait until the server reports `expected` sessions (a close is processed asynchronously)."""
    deadline = time.monotonic() + timeout
    while (now := await asyncio.to_thread(active_sessions, base_url)) != expected:
        assert time.monotonic() < deadline, f"{base_url} has {now} sessions, expected {expected}"
        await asyncio.sleep(0.05)


async def close_all(clients: list[Any]) -> None:
    await asyncio.gather(*(c.close() for c in clients))


async def test_new_episodes_spread_evenly_over_idle_servers(echo_servers):
    urls = echo_servers(8, 8, 8)
    pool = EnvPool(urls)
    clients = [await pool.acquire() for _ in range(6)]
    try:
        assert Counter(c.base_url for c in clients) == {u: 2 for u in urls}
        for url in urls:
            await wait_active(url, 2)
        assert [s.opened for s in pool.servers()] == [2, 2, 2]
    finally:
        await close_all(clients)
    assert [s.opened for s in pool.servers()] == [0, 0, 0]


async def test_new_episodes_avoid_a_server_loaded_by_other_clients(echo_servers):
    busy, b, c = echo_servers(8, 8, 8)
    outsiders = [EnvClient(busy) for _ in range(4)]
    await asyncio.gather(*(o.connect() for o in outsiders))
    try:
        await wait_active(busy, 4)
        pool = EnvPool([busy, b, c])  # its first acquire polls /health: busy reports 4/8
        clients = [await pool.acquire() for _ in range(6)]
        try:
            assert Counter(cl.base_url for cl in clients) == {b: 3, c: 3}
            busy_view = next(s for s in pool.servers() if s.base_url == busy)
            assert (busy_view.opened, busy_view.active, busy_view.max_sessions) == (0, 4, 8)
            # b and c (3 of 8) are still below busy (4 of 8): they fill up to it first.
            more = [await pool.acquire() for _ in range(2)]
            clients += more
            assert Counter(cl.base_url for cl in more) == {b: 1, c: 1}
        finally:
            await close_all(clients)
    finally:
        await close_all(outsiders)


async def test_a_full_server_refuses_at_connect_and_is_skipped_until_its_backoff_ends(echo_servers):
    tiny, b, c = echo_servers(1, 8, 8)
    pool = EnvPool([tiny, b, c], settings=PoolSettings(health_interval_s=60))
    await pool.refresh_health(force=True)  # the pool has seen tiny empty (0/1)...
    squatter = EnvClient(tiny)
    await squatter.connect()  # ...and then someone else takes its only slot
    clients: list[Any] = []
    try:
        clients = [await pool.acquire() for _ in range(4)]
        assert {cl.base_url for cl in clients} == {b, c}
        tiny_view = next(s for s in pool.servers() if s.base_url == tiny)
        assert tiny_view.last_error is not None and "CAPACITY_REACHED" in tiny_view.last_error
        assert not tiny_view.available and tiny_view.opened == 0
        await squatter.close()
        await wait_active(tiny, 0)
        await asyncio.sleep(tiny_view.retry_in_s + 0.05)  # the server's retry_after_s hint
        await pool.refresh_health(force=True)
        late = await pool.acquire()
        clients.append(late)
        assert late.base_url == tiny  # the least-loaded server again, now that it has room
    finally:
        await squatter.close()
        await close_all(clients)


async def test_a_down_server_is_skipped_and_used_once_it_comes_back(echo_servers):
    (up,) = echo_servers(8)
    down_port = free_port()
    down = f"http://127.0.0.1:{down_port}"
    pool = EnvPool([down, up], settings=PoolSettings(backoff_base_s=0.2, health_interval_s=60))
    clients = [await pool.acquire() for _ in range(3)]
    try:
        assert {cl.base_url for cl in clients} == {up}
        down_view = next(s for s in pool.servers() if s.base_url == down)
        assert down_view.failures >= 1 and down_view.last_error and not down_view.available
        with running_server(echo_app(8), port=down_port):
            await asyncio.sleep(down_view.retry_in_s + 0.05)
            back = await pool.acquire()
            try:
                assert back.base_url == down  # retried after its backoff; emptier than `up`
                assert next(s for s in pool.servers() if s.base_url == down).failures == 0
                await back.reset()
            finally:
                await back.close()
    finally:
        await close_all(clients)


async def test_an_episode_stays_on_its_server_across_a_resume(echo_servers):
    urls = echo_servers(8, 8, 8)
    pool = EnvPool(urls)
    async with pool.session() as env:
        await env.reset(seed=1)
        await env.step({"message": "one"})
        home, session_id = env.base_url, env.session_id
        assert env._conn is not None
        await env._conn.close(1001)  # the socket goes away under the episode (going away: resumable)
        result = await env.step({"message": "two"})
        assert result.observation["echoed_message"] == "two"
        assert (env.base_url, env.session_id) == (home, session_id)
        assert env.session is not None and env.session.resumed
        assert (await env.state())["step_count"] == 2  # the same episode, not a new one
        assert [s.opened for s in pool.servers()] == [1 if u == home else 0 for u in urls]
        for url in urls:
            await wait_active(url, 1 if url == home else 0)


async def test_acquire_gives_up_naming_every_server_when_all_are_full(echo_servers):
    a, b = echo_servers(1, 1)
    pool = EnvPool([a, b], settings=PoolSettings(acquire_timeout_s=0.5))
    held = [await pool.acquire(), await pool.acquire()]
    try:
        started = time.monotonic()
        with pytest.raises(NoServerAvailableError) as info:
            await pool.acquire()
        assert 0.4 < time.monotonic() - started < 5
        assert a in str(info.value) and b in str(info.value) and "1/1" in str(info.value)
        assert [s.active for s in info.value.servers] == [1, 1]
    finally:
        await close_all(held)


def test_pool_specs_name_lists_registered_pools_and_replica_files(tmp_path):
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    as_json = tmp_path / "urls.json"
    as_json.write_text(json.dumps({"base_urls": urls}))
    as_text = tmp_path / "urls.txt"
    as_text.write_text("# replicas\nhttp://127.0.0.1:1\n\nhttp://127.0.0.1:2\n")
    assert read_base_urls_file(as_json) == urls == read_base_urls_file(as_text)
    pools["scaleout-test"] = [urls[0]]
    try:
        assert url_source("scaleout-test")() == [urls[0]]
        assert is_pool_spec("scaleout-test") and is_pool_spec(str(as_json)) and is_pool_spec(urls)
        assert not is_pool_spec(urls[0])
        assert url_source(str(as_text))() == urls
        with pytest.raises(EnvNotFoundError, match="scaleout-test"):
            url_source("no-such-pool")
    finally:
        del pools["scaleout-test"]


async def test_a_refreshed_source_adds_new_servers_and_retires_missing_ones_after_their_sessions(echo_servers):
    a, b = echo_servers(8, 8)
    listed = [a]
    pool = EnvPool(lambda: listed, settings=PoolSettings(refresh_interval_s=60))
    on_a = await pool.acquire()
    listed[:] = [b]
    assert pool.refresh_urls() == [b]
    on_b = await pool.acquire()
    try:
        assert (on_a.base_url, on_b.base_url) == (a, b)
        assert [(s.base_url, s.retired) for s in pool.servers()] == [(a, True), (b, False)]
    finally:
        await close_all([on_a, on_b])
    assert [s.base_url for s in pool.servers()] == [b]  # a retired server leaves with its last session


class _Hello:
    async def act(self, messages: list[dict[str, Any]]) -> str:
        return "hello"


async def test_the_openenv_scheduler_places_rows_with_a_list_of_base_urls_on_every_server(echo_servers):
    urls = echo_servers(8, 8, 8)
    scheduler = OpenEnvScheduler(max_turns=2, max_concurrent_envs=6)
    requests = [
        RolloutRequest(messages=[], data_dict={"env_config": {"base_url": list(urls), "seed": i}}) for i in range(6)
    ]
    trajectories = await scheduler.run(requests, _Hello())
    assert [t.status for t in trajectories] == ["max_turns"] * 6
    assert Counter(t.runtime.base_url for t in trajectories) == {u: 2 for u in urls}
    for url in urls:
        await wait_active(url, 0)  # every session closed at its end


async def test_rollouts_given_several_base_urls_use_every_server(echo_servers, tmp_path):
    urls = echo_servers(8, 8)
    parser = argparse.ArgumentParser()
    add_rollout_parser(parser.add_subparsers())
    args = parser.parse_args(["rollout", "--env", "echo", "--base-url", *urls])
    assert args.base_url == urls
    report = await run_rollouts(
        "echo", _Hello(), episodes=4, concurrency=4, max_turns=1, base_url=args.base_url,
        out=tmp_path / "completions.jsonl", progress=False,
    )
    assert report.summary.statuses == {"max_turns": 4}
    assert Counter(t.runtime.base_url for t in report.trajectories) == {u: 2 for u in urls}
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert all(row["env_config"]["base_url"] == urls for row in rows)


@pytest.mark.timeout(60)
def test_a_file_of_base_urls_with_a_line_that_is_no_url_is_refused_naming_the_line(tmp_path):
    """``echo 'garbage{{' > g.json; envsdk rollout --base-url g.json`` probed 'garbage{{' as a
    server, and the pre-flight blamed a stopped supervisor; a 200,000-line file was 200,000
    probes (6.6 s, 450 MB)."""
    from envsdk.client.pool import MAX_FILE_URLS
    from envsdk.preflight import PreflightError, check_env_servers

    garbage = tmp_path / "g.json"
    garbage.write_text("http://127.0.0.1:1\ngarbage{{\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"g\.json line 2: 'garbage\{\{' is not a base URL"):
        read_base_urls_file(garbage)
    with pytest.raises(PreflightError, match=r"line 2: 'garbage\{\{' is not a base URL") as refused:
        check_env_servers([str(garbage)], 1)
    assert "supervisor" not in str(refused.value)
    listed = tmp_path / "l.json"
    listed.write_text(json.dumps({"base_urls": ["http://127.0.0.1:1", 7]}), encoding="utf-8")
    with pytest.raises(ValueError, match="base URLs"):
        read_base_urls_file(listed)
    listed.write_text(json.dumps(["http://127.0.0.1:1", "127.0.0.1:2"]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"'127\.0\.0\.1:2' is not a base URL"):
        read_base_urls_file(listed)
    many = tmp_path / "many.txt"
    many.write_text("".join(f"http://127.0.0.1:{i % 60000 + 1}/{i}\n" for i in range(MAX_FILE_URLS + 1)))
    with pytest.raises(ValueError, match=f"more than {MAX_FILE_URLS}"):
        read_base_urls_file(many)
