"""Reads /etc/cron.d/reports the way Debian's cron does and checks, minute by minute over a whole
year, that its jobs fire exactly when the instruction says (any equivalent spelling passes:
ranges, steps, lists, names, several lines for one job). Writes /logs/verifier/reward.txt."""

import datetime
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path

PATH = Path("/etc/cron.d/reports")
YEAR = 2025
NAMES = {
    "month": ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
    "dow": ["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
}
BOUNDS = {"minute": (0, 59), "hour": (0, 23), "dom": (1, 31), "month": (1, 12), "dow": (0, 7)}
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
          "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
ENV_LINE = re.compile(r"^\s*([^\s=]+)\s*=\s*(.*?)\s*$")


class CronError(Exception):
    pass


def value(text: str, field: str) -> int:
    low = text.lower()
    if field in NAMES and low in NAMES[field]:
        return NAMES[field].index(low) + (1 if field == "month" else 0)
    if not text.isdigit():
        raise CronError(f"bad {field} value {text!r}")
    number = int(text)
    lo, hi = BOUNDS[field]
    if not lo <= number <= hi:
        raise CronError(f"{field} value {number} out of range")
    return number


def parse_field(text: str, field: str) -> set[int]:
    lo, hi = BOUNDS[field]
    result: set[int] = set()
    for item in text.split(","):
        rng, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"bad step in {item!r}")
            step = int(step_text)
        if rng == "*":
            first, last = lo, hi
        elif "-" in rng:
            a, _, b = rng.partition("-")
            first, last = value(a, field), value(b, field)
            if first > last:
                raise CronError(f"backwards range {rng!r}")
        else:
            first = value(rng, field)
            last = hi if step_text else first
        result.update(range(first, last + 1, step))
    if field == "dow" and 7 in result:
        result = (result - {7}) | {0}
    return result


class Job:
    def __init__(self, fields: list[str], user: str, command: str) -> None:
        minute, hour, dom, month, dow = fields
        self.minutes = parse_field(minute, "minute")
        self.hours = parse_field(hour, "hour")
        self.doms = parse_field(dom, "dom")
        self.months = parse_field(month, "month")
        self.dows = parse_field(dow, "dow")
        self.either_day = not dom.startswith("*") and not dow.startswith("*")
        self.user, self.command = user, command

    def fires_on(self, day: datetime.date) -> bool:
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.doms
        dow_ok = (day.isoweekday() % 7) in self.dows
        return (dom_ok or dow_ok) if self.either_day else (dom_ok and dow_ok)

    def times(self) -> set[tuple[int, int]]:
        return {(h, m) for h in self.hours for m in self.minutes}


def parse(text: str) -> tuple[dict[str, str], list[Job]]:
    env: dict[str, str] = {}
    jobs: list[Job] = []
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        words = stripped.split()
        if words[0].lower() in MACROS:
            fields, rest = MACROS[words[0].lower()].split(), words[1:]
        elif words[0].startswith("@"):
            raise CronError(f"line {number}: {words[0]} does not run on a schedule")
        else:
            match = ENV_LINE.match(line)
            if match:  # NAME = value (a job line never has "=" right after its first word)
                name, raw = match.groups()
                if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
                    raw = raw[1:-1]
                env[name] = raw
                continue
            fields, rest = words[:5], words[5:]
        if len(fields) < 5 or len(rest) < 2:
            raise CronError(f"line {number}: needs five time fields, a user and a command")
        try:
            jobs.append(Job(fields, rest[0], " ".join(rest[1:])))
        except CronError as exc:
            raise CronError(f"line {number}: {exc}") from None
    return env, jobs


def expected() -> dict[tuple[str, str], set[datetime.datetime]]:
    def every(day_ok: Callable[[datetime.date], bool], times: list[tuple[int, int]]) -> set[datetime.datetime]:
        return {datetime.datetime(d.year, d.month, d.day, h, m) for d in days() if day_ok(d) for h, m in times}

    return {
        ("reports", "/usr/local/bin/send-report"): every(lambda d: d.isoweekday() <= 5, [(7, 30)]),
        ("root", "/usr/local/bin/prune-tmp"): every(lambda d: True, [(h, m) for h in range(8, 19) for m in (0, 20, 40)]),
        ("billing", "/usr/local/bin/monthly-invoice"): every(lambda d: d.day == 1 and d.month in (1, 4, 7, 10), [(3, 15)]),
    }


def days() -> list[datetime.date]:
    start = datetime.date(YEAR, 1, 1)
    return [start + datetime.timedelta(days=i) for i in range(365)]


def check() -> list[str]:
    problems: list[str] = []
    try:
        info = os.lstat(PATH)
    except OSError:
        return [f"{PATH} does not exist"]
    if not stat.S_ISREG(info.st_mode):
        return [f"{PATH} is not a regular file"]
    if info.st_uid != 0:
        problems.append("not owned by root")
    if info.st_mode & 0o022:
        problems.append(f"mode {stat.S_IMODE(info.st_mode):o} is writable by group or others")
    data = PATH.read_bytes()
    if not data.endswith(b"\n"):
        problems.append("no newline at the end (cron drops the last line)")
    try:
        env, jobs = parse(data.decode("utf-8"))
    except (CronError, UnicodeDecodeError) as exc:
        return problems + [str(exc)]
    if env.get("MAILTO") != "":
        problems.append(f"MAILTO is {env.get('MAILTO')!r}, not empty")
    if env.get("SHELL") != "/bin/bash":
        problems.append(f"SHELL is {env.get('SHELL')!r}")
    fired: dict[tuple[str, str], set[datetime.datetime]] = {}
    for job in jobs:
        moments = fired.setdefault((job.user, job.command), set())
        times = job.times()
        for day in days():
            if job.fires_on(day):
                moments.update(datetime.datetime(day.year, day.month, day.day, h, m) for h, m in times)
    wanted = expected()
    if set(fired) != set(wanted):
        problems.append(f"jobs (user, command) {sorted(fired)} instead of {sorted(wanted)}")
    for key, moments in wanted.items():
        got = fired.get(key, set())
        if key in fired and got != moments:
            extra, missing = sorted(got - moments)[:3], sorted(moments - got)[:3]
            problems.append(f"{key[1]}: fires {len(got)} times in {YEAR} instead of {len(moments)}"
                            f" (extra e.g. {[str(t) for t in extra]}, missing e.g. {[str(t) for t in missing]})")
    return problems


def main() -> None:
    problems = check()
    for problem in problems:
        print(problem)
    Path("/logs/verifier/reward.txt").write_text("0\n" if problems else "1\n")


if __name__ == "__main__":
    main()
    sys.exit(0)
