"""The reward-hack probe: known reward hacks on code graders, sent to a code env over the wire.

GRPO reinforces whatever earns reward, so a grader that a program can fool teaches the fooling.
`PROBES` (`envsdk.hack_probe.catalogue`) are the hacks, each written as a policy would send
it; `probe_env` / `probe_hacks` (`envsdk.hack_probe.runner`) play each one in its own session
on a few HumanEval problems, beside two controls (the canonical solution must earn 1.0, a wrong
answer 0.0), and report what each earned. ``envsdk check-env --hacks`` is the command.
"""

from envsdk.hack_probe.catalogue import PROBES, Probe, Task, probe_named, wrong_answer
from envsdk.hack_probe.runner import (
    DEFAULT_PROBLEMS,
    PROBLEM_ORDER,
    Episode,
    HackProbeError,
    HackReport,
    ProbeResult,
    embedded_coding_server,
    probe_env,
    probe_hacks,
)

__all__ = [
    "PROBES",
    "Probe",
    "Task",
    "probe_named",
    "wrong_answer",
    "DEFAULT_PROBLEMS",
    "PROBLEM_ORDER",
    "Episode",
    "HackProbeError",
    "HackReport",
    "ProbeResult",
    "embedded_coding_server",
    "probe_env",
    "probe_hacks",
]
