"""Server counters, rendered in the Prometheus text exposition format for ``GET /metrics``.

Plain integers and floats updated on the event loop (no locks needed); no client library.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping

__all__ = ["Metrics", "STEP_LATENCY_BUCKETS_S"]

STEP_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


class Metrics:
    """What `/metrics` reports; the session table and request handling update it."""

    def __init__(self) -> None:
        self.sessions_opened = 0
        self.sessions_closed = 0
        self.steps = 0
        self.resets = 0
        self.tool_calls = 0
        self.lane_calls_waited = 0  # sync env calls the loop waited for (see envsdk.server.executors)
        self.lane_calls_awaited = 0  # ... and those it went on serving during
        self.lane_waits_given_up = 0  # awaited calls the loop had first waited for, in vain
        self.errors: Counter[str] = Counter()
        self._step_buckets = [0] * (len(STEP_LATENCY_BUCKETS_S) + 1)
        self._step_sum_s = 0.0

    def observe_step(self, seconds: float) -> None:
        self.steps += 1
        self._step_sum_s += seconds
        self._step_buckets[bisect.bisect_left(STEP_LATENCY_BUCKETS_S, seconds)] += 1

    def render(
        self,
        *,
        active_sessions: int,
        max_sessions: int,
        lane_threads: int,
        abandoned_threads: int,
        loop_stalls: Mapping[str, int] | None = None,
        loop_stall_seconds: Mapping[str, float] | None = None,
    ) -> str:
        lines = [
            "# HELP envsdk_lane_threads Lane threads serving sessions' synchronous env calls.",
            "# TYPE envsdk_lane_threads gauge",
            f"envsdk_lane_threads {lane_threads}",
            "# HELP envsdk_abandoned_threads Lane threads written off by a deadline, still in env code.",
            "# TYPE envsdk_abandoned_threads gauge",
            f"envsdk_abandoned_threads {abandoned_threads}",
            "# HELP envsdk_active_sessions Sessions holding an environment instance.",
            "# TYPE envsdk_active_sessions gauge",
            f"envsdk_active_sessions {active_sessions}",
            "# HELP envsdk_max_sessions Session capacity (max_concurrent_envs).",
            "# TYPE envsdk_max_sessions gauge",
            f"envsdk_max_sessions {max_sessions}",
            "# HELP envsdk_sessions_opened_total Sessions created.",
            "# TYPE envsdk_sessions_opened_total counter",
            f"envsdk_sessions_opened_total {self.sessions_opened}",
            "# HELP envsdk_sessions_closed_total Sessions destroyed (slot freed).",
            "# TYPE envsdk_sessions_closed_total counter",
            f"envsdk_sessions_closed_total {self.sessions_closed}",
            "# HELP envsdk_resets_total Resets executed.",
            "# TYPE envsdk_resets_total counter",
            f"envsdk_resets_total {self.resets}",
            "# HELP envsdk_steps_total Steps executed.",
            "# TYPE envsdk_steps_total counter",
            f"envsdk_steps_total {self.steps}",
            "# HELP envsdk_tool_calls_total MCP tool calls executed (tools/call and call_tool actions).",
            "# TYPE envsdk_tool_calls_total counter",
            f"envsdk_tool_calls_total {self.tool_calls}",
            "# HELP envsdk_lane_calls_total Synchronous env calls run on lane threads, by hand-off: "
            "'waited' (the loop waited for the call, a fast one) or 'awaited' (the loop served others meanwhile).",
            "# TYPE envsdk_lane_calls_total counter",
            f'envsdk_lane_calls_total{{handoff="waited"}} {self.lane_calls_waited}',
            f'envsdk_lane_calls_total{{handoff="awaited"}} {self.lane_calls_awaited}',
            "# HELP envsdk_lane_waits_given_up_total Awaited lane calls the loop had first waited "
            "lane_wait_s for in vain (a call that turned slow, or hung).",
            "# TYPE envsdk_lane_waits_given_up_total counter",
            f"envsdk_lane_waits_given_up_total {self.lane_waits_given_up}",
            "# HELP envsdk_errors_total Error frames sent, by code.",
            "# TYPE envsdk_errors_total counter",
        ]
        lines += [f'envsdk_errors_total{{code="{code}"}} {n}' for code, n in sorted(self.errors.items())]
        lines += [
            (
                "# HELP envsdk_loop_stalls_total Stretches an async env method ran on the event loop "
                "past loop_stall_s without awaiting (every session waited), by env class and method."
            ),
            "# TYPE envsdk_loop_stalls_total counter",
            *(f'envsdk_loop_stalls_total{{method="{m}"}} {n}' for m, n in sorted((loop_stalls or {}).items())),
            "# HELP envsdk_loop_stall_seconds_total Seconds those stretches held the event loop.",
            "# TYPE envsdk_loop_stall_seconds_total counter",
            *(
                f'envsdk_loop_stall_seconds_total{{method="{m}"}} {s}'
                for m, s in sorted((loop_stall_seconds or {}).items())
            ),
        ]
        lines += [
            "# HELP envsdk_step_duration_seconds Time spent in env.step.",
            "# TYPE envsdk_step_duration_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip(STEP_LATENCY_BUCKETS_S, self._step_buckets):
            cumulative += count
            lines.append(f'envsdk_step_duration_seconds_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'envsdk_step_duration_seconds_bucket{{le="+Inf"}} {self.steps}')
        lines.append(f"envsdk_step_duration_seconds_sum {self._step_sum_s}")
        lines.append(f"envsdk_step_duration_seconds_count {self.steps}")
        return "\n".join(lines) + "\n"
