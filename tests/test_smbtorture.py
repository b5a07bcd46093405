"""Samba's smbtorture (Debian's samba-testsuite) SMB2 suites against nimbus.

Each suite runs against a fresh server. Its results are compared with
what `smbtorture --list SUITE` says the suite holds, and with two lists:
tests/smbtorture/known-failures.txt, which can only shrink, and
tests/smbtorture/expected-skips.txt:

- a test that fails and is not a known failure is a regression: this test
  fails;
- a known failure that now passes must be taken off the list: this test
  fails and says "remove NAME from known-failures";
- a known failure that no longer runs (renamed, or skipped) must come off too;
- a test of the suite's --list that reports no result never ran: this test
  fails;
- a test that skips and is not an expected skip fails this test (a test
  that went from success to skip would otherwise go unseen);
- an expected skip that runs (passes or fails) must come off that list.

Both files hold one full test name per line followed by `# reason`; a line
starting with # is a comment. Every entry must give its reason, and no
test is in both.

NIMBUS_TORTURE_TIMEOUT (seconds, default 180; smbd needs at most 11) bounds each
suite.

The suites run NIMBUS_TORTURE_LANES (default 3) at a time, each against its
own server: most of a suite's time is smbtorture waiting on purpose (a
second for a break that must not come, 200 ms per completion filter of
smb2.notify.mask, a 35 s break timeout), not work, so lanes cut the wall
time without loading the machine. The first suite test of the module
starts every selected suite, longest first; each test then waits for its
own suite's result.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import shutil
import re
import shlex
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import _SERVERS, SHARE, Security, ServerFactory, require_tool

SUITES = [
    "smb2.connect",
    "smb2.read",
    "smb2.rw",
    "smb2.dir",
    "smb2.getinfo",
    "smb2.setinfo",
    "smb2.compound",
    "smb2.credits",
    "smb2.lock",
    "smb2.create",
    "smb2.notify",
    "smb2.oplock",
    "smb2.lease",
    "smb2.rename",
    "smb2.durable-open",
    "smb2.durable-v2-open",
    "smb2.durable-v2-delay",
    "smb2.replay",
    "smb2.session",
    "smb2.multichannel",
    "smb2.ioctl",
    "smb2.timestamps",
    "smb2.delete-on-close-perms",
    "smb2.fileid",
    "smb2.dosmode",
    "smb2.winattr",
    "smb2.acls",
    "smb2.streams",
    "smb2.ea",
    "vfs.fruit",
]
ABE_SHARE = "hideunread"
APPLE_MODEL = "MacSamba"
NO_APPLE_SHARE = "nofruit"
# smb2.dosmode: the names Samba's selftest share hides ("hide files =
# /hidefile/"; names starting with a dot are hidden by default).
HIDE_FILES = ["hidefile"]
# smb2.ea.acl_xattr: the extended attribute a file's security descriptor is
# kept in (crate::acl::store), which must never show as an EA.
ACL_XATTR_OPTION = "--option=torture:acl_xattr_name=user.nimbus.sd"
# A second user, for smb2.session.bind_different_user (torture:user2name).
USER2 = ("bob", "B0b-Torture-2!")
KNOWN_FAILURES = Path(__file__).resolve().parent / "smbtorture" / "known-failures.txt"
EXPECTED_SKIPS = Path(__file__).resolve().parent / "smbtorture" / "expected-skips.txt"
SUITE_TIMEOUT = int(os.environ.get("NIMBUS_TORTURE_TIMEOUT", "180"))
# Suites that wait out break acknowledgement timeouts (35 s, as on Windows
# and Samba) several times take longer.
SUITE_TIMEOUTS = {
    "smb2.lease": max(SUITE_TIMEOUT, 420),
    "smb2.oplock": max(SUITE_TIMEOUT, 300),
    "smb2.replay": max(SUITE_TIMEOUT, 300),
    # Its break-retry tests each wait out a break timeout with all channels
    # blocked, a channel given up every 1.2 s.
    "smb2.multichannel": max(SUITE_TIMEOUT, 360),
}

LANES = max(1, int(os.environ.get("NIMBUS_TORTURE_LANES", "3")))
# Seconds each suite took against nimbus (measured), to start the longest
# first; suites not named here count as short.
SUITE_DURATIONS = {
    "smb2.lease": 200,
    "smb2.oplock": 110,
    "smb2.replay": 85,
    "smb2.notify": 80,
}

PASS, FAIL, SKIP = "pass", "fail", "skip"
_OUTCOMES = {
    "success": PASS,
    "successful": PASS,
    "uxsuccess": PASS,
    "failure": FAIL,
    "fail": FAIL,
    "error": FAIL,
    "xfail": FAIL,
    "skip": SKIP,
    "todo": SKIP,
}
# subunit v1 as smbtorture writes it: "test: NAME", then "success: NAME",
# "failure: NAME [" ... "]", "error: NAME [" ... "]", "skip: NAME [" ... "]".
# A name may hold a space (smb2.ioctl."copy-chunk streams").
_LINE = re.compile(r"^(?P<word>[a-z]+): (?P<name>\S.*?)(?P<bracket> \[)?\s*$")


@dataclass
class SuiteRun:
    outcomes: dict[str, str] = field(default_factory=dict)  # test -> PASS / FAIL / SKIP
    details: dict[str, str] = field(default_factory=dict)  # test -> reason smbtorture gave
    unfinished: list[str] = field(default_factory=list)  # started, no result: smbtorture died or was stopped
    crashed_in: list[str] = field(default_factory=list)  # tests during which smbtorture died
    timed_out: bool = False
    returncode: int | None = None
    output: str = ""
    log_path: Path | None = None
    server: object = None  # the conftest.Server it ran against, when it had one of its own
    server_problems: list[str] = field(default_factory=list)  # the server died during the suite


def parse_subunit(text: str) -> SuiteRun:
    run = SuiteRun(output=text)
    started: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _LINE.match(lines[i])
        i += 1
        if not m:
            continue
        word, name = m["word"], m["name"]
        if word == "test":
            started.append(name)
            continue
        if word not in _OUTCOMES:
            continue  # time:, progress:, ...
        detail = []
        if m["bracket"]:
            while i < len(lines) and lines[i].rstrip() != "]":
                detail.append(lines[i])
                i += 1
            i += 1  # the closing ]
        run.outcomes[name] = _OUTCOMES[word]
        run.details[name] = "\n".join(detail).strip()
    for name in started:
        if name not in run.outcomes:
            run.outcomes[name] = FAIL
            run.details[name] = "started but gave no result (smbtorture ended or timed out during it)"
            run.unfinished.append(name)
    return run


def load_known_failures(path: Path = KNOWN_FAILURES) -> tuple[dict[str, str], list[str]]:
    """Return ({test name: reason}, [problems with the file])."""
    return load_entries(path, "fails")


def load_expected_skips(path: Path = EXPECTED_SKIPS) -> tuple[dict[str, str], list[str]]:
    """Return ({test name: reason}, [problems with the file])."""
    return load_entries(path, "skips")


def load_entries(path: Path, verb: str) -> tuple[dict[str, str], list[str]]:
    """Parse a list of `NAME  # reason` lines: ({test name: reason}, [problems])."""
    entries: dict[str, str] = {}
    problems: list[str] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path.name}:{lineno}"
        name, sep, reason = line.partition("#")
        name, reason = name.strip(), reason.strip()
        if not sep or not reason:
            problems.append(f"{where}: `{name}` gives no reason; write `{name}  # why it {verb}`")
        # Test names may hold single spaces (smb2.ioctl.copy-chunk streams).
        if not name or name != " ".join(name.split()):
            problems.append(f"{where}: `{name}` is not one test name")
            continue
        if name in entries:
            problems.append(f"{where}: `{name}` is listed twice")
        if not any(name == s or name.startswith(s + ".") for s in SUITES):
            problems.append(f"{where}: `{name}` is in none of the suites run here ({', '.join(SUITES)})")
        entries[name] = reason
    return entries, problems


def list_tests(suite: str) -> list[str]:
    """The tests of `suite`, named as --fullname reports them.

    `smbtorture --list` prints suite.tcase.test; a test alone in its tcase
    of the same name is reported as suite.test.
    """
    proc = subprocess.run(["smbtorture", "--list", suite], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    names = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line != suite and not line.startswith(suite + "."):
            continue  # --list also matches longer suite names (smb2.compound_find)
        parts = line.split(".")
        if len(parts) > 2 and parts[-1] == parts[-2]:
            parts.pop()
        names.append(".".join(parts))
    return names


def _crash_summary(text: str) -> str:
    for line in text.splitlines():
        if "INTERNAL ERROR" in line or line.startswith("PANIC") or "Segmentation fault" in line:
            return line.strip()
    return ""


# The tests smbtorture runs with --target=samba3, and why: where Windows and
# Samba differ, and Nimbus behaves like Samba. Every other test is held to
# smbtorture's default (Windows) expectations.
SAMBA3_TARGET = {
    # Writes just below NTFS's largest file size: Windows refuses them with
    # DISK_FULL; Samba, and Nimbus, write what the local file system allows.
    "smb2.rw.invalid": "a write near NTFS's size limit succeeds, as on Samba",
    # A lease held through two connections of one client: which of them
    # the break goes to is checked only against Windows (CHECK_BREAK_INFO_V2);
    # Nimbus picks as Samba does.
    "smb2.lease.v2_complex1": "the connection a shared lease's break goes to",
    # Runs only against Samba (it needs Samba's per-user "dynamic" share):
    # under samba3 it runs, and fails as its known-failures entry says,
    # instead of being skipped.
    "smb2.lease.dynamic_share": "runs only with --target=samba3",
}


# smbtorture's multichannel and replay tests stop a channel that should
# stop acknowledging by dropping its packets with iptables
# (torture:use_iptables): Samba's own FSCTL for it exists only in smbd. Each
# run gets chains of its own (smbtorture/iptables-lane), named after this
# process and the run, removed after it; those of a pytest that was killed
# are removed at the first run of the next.
IPTABLES_LANE = Path(__file__).resolve().parent / "smbtorture" / "iptables-lane"
# Not smb2.oplock: its batch22b measures a 35 s break timeout from before it
# blocks the channel, and the iptables calls take about a second of that.
BLOCKING_SUITES = ("smb2.multichannel", "smb2.replay")
_BLOCKING_RUNS = itertools.count(1)
_BLOCKING_CHAIN = re.compile(r"ST(\d+)r\d+")
_blocking_checked: list[bool] = []


def iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)


def blocking_options(prefix: str) -> list[str]:
    if not _blocking_checked:
        usable = shutil.which("iptables") is not None and iptables("-S").returncode == 0
        if not usable:
            raise RuntimeError(
                "iptables not found or not usable (it needs root): smbtorture's multichannel and replay tests cut "
                "channels with it (scripts/test.sh installs it)"
            )
        for line in iptables("-S").stdout.splitlines():
            m = _BLOCKING_CHAIN.match(line.split()[1]) if line.startswith("-N ") else None
            if m and int(m[1]) != os.getpid() and not Path(f"/proc/{m[1]}").exists():
                remove_blocking_chains(f"ST{m[1]}r")
        _blocking_checked.append(True)
    return ["--option=torture:use_iptables=yes", f"--option=torture:iptables_command={shlex.quote(str(IPTABLES_LANE))} {prefix}"]


def remove_blocking_chains(prefix: str) -> None:
    """What runs left in iptables under chains starting with `prefix`
    (smbtorture killed before it unblocked): the chains, and the jumps to
    them."""
    listing = iptables("-S").stdout.splitlines()
    chains = [line.split()[1] for line in listing if line.startswith("-N ") and line.split()[1].startswith(prefix)]
    for chain in chains:
        iptables("-F", chain)
    for line in listing:
        words = line.split()
        if line.startswith("-A OUTPUT ") and words[-1] in chains:
            iptables("-D", "OUTPUT", "-j", words[-1])
    for chain in chains:
        iptables("-X", chain)


def run_smbtorture(
    server, suite: str, client_conf: Path, log_path: Path, timeout: int = SUITE_TIMEOUT, options: list[str] = (), pinned: tuple[object, dict[str, str]] | None = None
) -> SuiteRun:
    """Run one suite within `timeout` seconds in all: its tests in
    SAMBA3_TARGET with --target=samba3, the others without.

    `pinned` is (another server, {pattern: reason}): the tests whose
    names match a pattern (fnmatch) run against that server instead.

    When smbtorture itself dies during a test (it has crashed on answers it
    did not expect), that test counts as failed and smbtorture is started
    again on the tests that had not run yet, so one crash does not hide the
    rest of the suite.
    """
    other, patterns = pinned if pinned else (server, {})
    workdir = log_path.parent  # smbtorture leaves a smbtortureXXXXXX directory in its working directory
    all_tests = list_tests(suite)
    pinned_tests = {t for t in all_tests if any(fnmatch.fnmatchcase(t, p) for p in patterns)}
    # (server, options, the tests to run: None for the whole suite)
    phases: list[tuple[object, list[str], list[str] | None]] = [(server, [], None)]
    if any(t in SAMBA3_TARGET or t in pinned_tests for t in all_tests):
        phases = [
            (to, target, [t for t in all_tests if (t in SAMBA3_TARGET) == samba3 and (t in pinned_tests) == moved])
            for moved, to in ((False, server), (True, other))
            for samba3, target in ((False, []), (True, ["--target=samba3"]))
        ]
    deadline = time.monotonic() + timeout
    result = SuiteRun()
    logs: list[str] = []
    prefix = f"ST{os.getpid()}r{next(_BLOCKING_RUNS)}"
    if suite in BLOCKING_SUITES:
        options = [*options, *blocking_options(prefix)]
    try:
        run_phases(phases, client_conf, options, suite, workdir, deadline, result, logs)
    finally:
        if suite in BLOCKING_SUITES:
            remove_blocking_chains(prefix + "_")
    result.output = "\n".join(logs)
    result.log_path = log_path
    log_path.write_text(result.output)
    return result


def run_phases(phases, client_conf: Path, options: list[str], suite: str, workdir: Path, deadline: float, result: SuiteRun, logs: list[str]) -> None:
    for n, (to, target, tests) in enumerate(phases):
        if tests == []:
            continue
        base = [
            "smbtorture",
            f"//{to.host}/{to.share}",
            "-p", str(to.port),
            "-U", f"{to.user}%{to.password}",
            "--use-kerberos=off",
            "-s", str(client_conf),
            "--format=subunit",
            "--fullname",
            *options,
            *target,
        ]  # fmt: skip
        if not run_phase(base, suite, tests, workdir, f"{n}", deadline, result, logs):
            break


def run_phase(base: list[str], suite: str, tests: list[str] | None, workdir: Path, tag: str, deadline: float, result: SuiteRun, logs: list[str]) -> bool:
    """Runs `tests` of `suite` (None: all of it) into `result`, again on
    the tests left whenever smbtorture dies; False when time ran out."""
    phase_tests = tests if tests is not None else list_tests(suite)
    pending = tests
    for attempt in range(1, len(phase_tests) + 2):
        left = int(deadline - time.monotonic())
        if left <= 0:
            result.timed_out = True
            return False
        cmd = [*base, f"--maximum-runtime={left}"]
        if pending is not None:
            load_list = workdir / f"{suite}.{tag}.remaining-{attempt}.txt"
            load_list.write_text("".join(n + "\n" for n in pending))
            cmd.append(f"--load-list={load_list}")
        cmd.append(suite)
        timed_out = False
        try:
            proc = subprocess.run(cmd, cwd=workdir, capture_output=True, timeout=left + 30, stdin=subprocess.DEVNULL)
            out, returncode = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out, returncode, timed_out = (e.stdout or b"") + (e.stderr or b""), None, True
        text = out.decode("utf-8", errors="replace")
        logs.append(f"### {' '.join(cmd)}\n{text}")
        part = parse_subunit(text)
        result.outcomes.update(part.outcomes)
        result.details.update(part.details)
        result.returncode = returncode
        if timed_out or "maximum runtime" in text.lower():
            result.timed_out = True
            return False
        if not part.unfinished:
            return True  # smbtorture got to the end
        crash = _crash_summary(text) or f"smbtorture exited with status {returncode}"
        for name in part.unfinished:
            result.details[name] = f"smbtorture died during this test: {crash}"
            result.crashed_in.append(name)
        pending = [n for n in phase_tests if n not in result.outcomes]
        if not pending:
            return True
    return True


class SuiteLanes:
    """Runs suites `lanes` at a time on threads: `run_one(suite)` runs one
    and returns its SuiteRun; `result(suite)` waits for it.

    Suites start longest first (SUITE_DURATIONS), so the long ones do not
    end up last in a lane.
    """

    def __init__(self, run_one, lanes: int = LANES):
        self._run_one = run_one
        self._pool = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="smbtorture")
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()

    def start(self, suites: list[str]) -> None:
        with self._lock:
            for suite in sorted(suites, key=lambda s: -SUITE_DURATIONS.get(s, 0)):
                if suite not in self._futures:
                    self._futures[suite] = self._pool.submit(self._run_one, suite)

    def result(self, suite: str) -> SuiteRun:
        self.start([suite])
        return self._futures[suite].result()

    def close(self) -> None:
        # Suites already running are bounded by their own timeouts.
        self._pool.shutdown(wait=True, cancel_futures=True)


def selected_suites(request) -> list[str]:
    """The suites of the tests of this module that this pytest run will run."""
    suites = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and request.fixturename in getattr(item, "fixturenames", ()) and callspec and "suite" in callspec.params:
            suites.append(callspec.params["suite"])
    return suites


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


# A known failure's entry ends with the failure it is known for, after
# FIRST_FAILURE: smbtorture's first failure message of the test (source
# file:line and message). A known failure that fails otherwise (earlier in
# the test, or at the same check with another value) is a regression.
FIRST_FAILURE = " @ "
_TORTURE_SOURCE = re.compile(r"(\.\./)*source4/torture/")
_WHERE = re.compile(r"(\S+?\.c:\d+)\)?:?\s*(.*)")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def failure_signature(detail: str) -> str:
    """The first line of a failure's details as `file.c:line: message`,
    without what differs from run to run: the source tree's relative
    prefix, and the values of a pointer comparison."""
    line = _TORTURE_SOURCE.sub("", first_line(detail).lstrip("( "))
    m = _WHERE.fullmatch(line)
    if m:
        line = f"{m[1]}: {m[2]}"
    if "(uintptr_t)" in line:
        line = _ADDRESS.sub("0x…", line)
    return line


def fails_as_known(got: str, expected: list[str]) -> bool:
    """Whether failure `got` is one an entry is known for. A value the
    entry writes `0x…` stands for any but zero: a count that depends on
    timing (how many channels a break timeout leaves time for), as
    pointers do."""
    for e in expected:
        if "0x…" not in e:
            if got == e:
                return True
            continue
        pattern = re.escape(e).replace(re.escape("0x…"), "0x(?:…|0*[1-9a-fA-F][0-9a-fA-F]*)")
        if re.fullmatch(pattern, got):
            return True
    return False


def known_first_failures(reason: str) -> list[str]:
    """The failures an entry is known for (one, or several separated by
    ` | ` when a run can end either way)."""
    _, sep, first = reason.partition(FIRST_FAILURE)
    return [f.strip() for f in first.split(" | ")] if sep else []


# --------------------------------------------------------------------------


def test_known_failures_file_is_well_formed():
    known, problems = load_known_failures()
    problems += [f"{n}: no failure recorded (end its entry with `{FIRST_FAILURE.strip()} FIRST FAILURE`)" for n, r in known.items() if not known_first_failures(r)]
    assert not problems, "\n".join(problems)


def test_expected_skips_file_is_well_formed():
    skips, problems = load_expected_skips()
    known, _ = load_known_failures()
    problems += [f"{n} is in both known-failures.txt and expected-skips.txt" for n in sorted(set(skips) & set(known))]
    assert not problems, "\n".join(problems)


def in_suite(name: str, suite: str) -> bool:
    return name == suite or name.startswith(suite + ".")


def judge(suite: str, listed: list[str], run: SuiteRun, known: dict[str, str], skips: dict[str, str]) -> list[str]:
    """What is wrong with one suite's run: a message per problem, none if all is well.

    `listed` is the suite's tests from `smbtorture --list`, `known` and
    `skips` the entries of known-failures.txt and expected-skips.txt.
    """
    known_here = {n: r for n, r in known.items() if in_suite(n, suite)}
    skips_here = {n: r for n, r in skips.items() if in_suite(n, suite)}
    problems = []
    if not listed:
        problems.append(f"`smbtorture --list {suite}` listed no test")
    if not run.outcomes:
        tail = "\n".join(run.output.splitlines()[-30:])
        problems.append(f"smbtorture reported no result (exit status {run.returncode}):\n{tail}")
    if run.timed_out:
        problems.append(
            f"{suite} did not finish within {SUITE_TIMEOUTS.get(suite, SUITE_TIMEOUT)} s; the tests after the last result did not run"
        )

    regressions = sorted(n for n, o in run.outcomes.items() if o == FAIL and n not in known)
    if regressions:
        problems.append(
            "failed and not in tests/smbtorture/known-failures.txt (regression):\n"
            + "\n".join(f"  {n}: {first_line(run.details.get(n, ''))}" for n in regressions)
            + "\n(a failure to accept for now goes in that file as `NAME  # reason`)"
        )
    differently = []
    for n in sorted(n for n in known_here if run.outcomes.get(n) == FAIL):
        got = failure_signature(run.details.get(n, ""))
        expected = known_first_failures(known_here[n])
        if not fails_as_known(got, expected):
            differently.append(f"  {n}:\n    known for: {' | '.join(expected) or '(nothing recorded)'}\n    failed at: {got}")
    if differently:
        problems.append(
            "known failures that failed otherwise than recorded (a regression earlier in the test, or a "
            f"new value; the entry ends with `{FIRST_FAILURE.strip()} FIRST FAILURE`):\n" + "\n".join(differently)
        )
    fixed = sorted(n for n in known_here if run.outcomes.get(n) == PASS)
    if fixed:
        problems.append("listed as known failures but now pass:\n" + "\n".join(f"  remove {n} from known-failures" for n in fixed))
    unexpected_skips = sorted(n for n, o in run.outcomes.items() if o == SKIP and n not in skips and n not in known)
    if unexpected_skips:
        problems.append(
            "skipped and not in tests/smbtorture/expected-skips.txt:\n"
            + "\n".join(f"  {n}: {first_line(run.details.get(n, ''))}" for n in unexpected_skips)
            + "\n(a skip to accept goes in that file as `NAME  # reason`)"
        )
    if not run.timed_out and run.outcomes:
        # After a timeout the tests that did not run are already reported.
        stale = sorted(n for n in known_here if run.outcomes.get(n) in (None, SKIP))
        if stale:
            problems.append(
                "listed as known failures but did not run or were skipped:\n"
                + "\n".join(f"  remove {n} from known-failures" for n in stale)
            )
        never_ran = sorted(n for n in listed if n not in run.outcomes)
        if never_ran:
            problems.append(f"in `smbtorture --list {suite}` but reported no result (never ran):\n" + "\n".join(f"  {n}" for n in never_ran))
        stale_skips = sorted(n for n in skips_here if run.outcomes.get(n) != SKIP)
        if stale_skips:
            problems.append(
                "listed as expected skips but ran, or reported no result:\n"
                + "\n".join(f"  remove {n} from expected-skips ({run.outcomes.get(n, 'no result')})" for n in stale_skips)
            )
    return problems


def fake_run(**outcomes: str) -> SuiteRun:
    """A SuiteRun with these outcomes (test name with `_` for `.`)."""
    return SuiteRun(outcomes={k.replace("_", "."): v for k, v in outcomes.items()}, output="(fake)")


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        pytest.param({"s_a": PASS, "s_b": SKIP, "s_c": FAIL}, [], id="clean"),
        pytest.param({"s_a": PASS, "s_c": FAIL}, ["remove s.b from expected-skips (no result)", "never ran):\n  s.b"], id="expected-skip-never-ran"),
        pytest.param({"s_b": SKIP, "s_c": FAIL}, ["never ran):\n  s.a"], id="never-ran"),
        pytest.param({"s_a": SKIP, "s_b": SKIP, "s_c": FAIL}, ["skipped and not in tests/smbtorture/expected-skips.txt:\n  s.a"], id="success-to-skip"),
        pytest.param({"s_a": PASS, "s_b": PASS, "s_c": FAIL}, ["remove s.b from expected-skips (pass)"], id="expected-skip-passes"),
        pytest.param({"s_a": FAIL, "s_b": SKIP, "s_c": FAIL}, ["(regression):\n  s.a"], id="regression"),
        pytest.param({"s_a": PASS, "s_b": SKIP, "s_c": PASS}, ["remove s.c from known-failures"], id="known-failure-passes"),
        pytest.param({"s_a": PASS, "s_b": SKIP, "s_c": SKIP}, ["remove s.c from known-failures"], id="known-failure-skips"),
    ],
)
def test_judge(outcomes, expected):
    # Suite "s" lists a, b and c; b is an expected skip, c a known failure
    # (at x.c:10, as it does when it fails here).
    run = fake_run(**outcomes)
    run.details["s.c"] = "../../source4/torture/smb2/x.c:10: status was NT_STATUS_OK, expected NT_STATUS_DISK_FULL"
    problems = judge("s", ["s.a", "s.b", "s.c"], run, {"s.c": KNOWN_AT_X10}, {"s.b": "skips"})
    text = "\n".join(problems)
    assert len(problems) == len(expected), text
    for fragment in expected:
        assert fragment in text


KNOWN_AT_X10 = "fails @ smb2/x.c:10: status was NT_STATUS_OK, expected NT_STATUS_DISK_FULL"


@pytest.mark.parametrize(
    ("detail", "otherwise"),
    [
        pytest.param("../../source4/torture/smb2/x.c:10: status was NT_STATUS_OK, expected NT_STATUS_DISK_FULL", False, id="as-known"),
        pytest.param("(../../source4/torture/smb2/x.c:10): status was NT_STATUS_OK, expected NT_STATUS_DISK_FULL", False, id="parenthesized"),
        pytest.param("../../source4/torture/smb2/x.c:7: status was NT_STATUS_ACCESS_DENIED, expected NT_STATUS_OK", True, id="earlier"),
        pytest.param("../../source4/torture/smb2/x.c:10: status was NT_STATUS_FILE_CLOSED, expected NT_STATUS_DISK_FULL", True, id="other-value"),
        pytest.param("", True, id="no-detail"),
    ],
)
def test_judge_of_a_known_failure_by_how_it_fails(detail, otherwise):
    run = fake_run(s_a=FAIL)
    run.details["s.a"] = detail
    problems = judge("s", ["s.a"], run, {"s.a": KNOWN_AT_X10}, {})
    assert bool(problems) == otherwise, problems
    assert not problems or "failed otherwise than recorded" in problems[0]


def test_a_failure_signature_masks_addresses_only():
    line = "(../../source4/torture/smb2/lease.c:3455): wrong value for (uintptr_t)t got 0x74c3fa0 - should be 0x74c3e80"
    assert failure_signature(line) == "smb2/lease.c:3455: wrong value for (uintptr_t)t got 0x… - should be 0x…"
    line = "(../../source4/torture/smb2/create.c:580) Incorrect value for access_mask 0x0de0fe00 - should be 0x0df0fe00"
    assert failure_signature(line) == "smb2/create.c:580: Incorrect value for access_mask 0x0de0fe00 - should be 0x0df0fe00"
    assert failure_signature("../../source4/torture/smb2/lease.c:4052couldn't reconnect") == "smb2/lease.c:4052: couldn't reconnect"
    assert known_first_failures("why @ a.c:1: x | a.c:2: y") == ["a.c:1: x", "a.c:2: y"]
    # An entry's 0x… stands for any value; its other values must match.
    assert fails_as_known("m.c:1: count got 0x18 - should be 0x1", ["m.c:1: count got 0x… - should be 0x1"])
    assert not fails_as_known("m.c:1: count got 0x18 - should be 0x2", ["m.c:1: count got 0x… - should be 0x1"])
    assert not fails_as_known("m.c:1: count got 0x0 - should be 0x1", ["m.c:1: count got 0x… - should be 0x1"])
    assert not fails_as_known("m.c:2: count got 0x18 - should be 0x1", ["m.c:1: count got 0x… - should be 0x1"])
    assert fails_as_known("a.c:1: x", ["a.c:1: x"]) and not fails_as_known("a.c:1: y", ["a.c:1: x"])


def test_judge_of_an_empty_list():
    problems = judge("s", [], fake_run(s_a=PASS), {}, {})
    assert problems == ["`smbtorture --list s` listed no test"]


@pytest.fixture(scope="module")
def suite_runs(request, tmp_path_factory, samba_client_conf):
    """Every selected suite, LANES at a time, each against a fresh server."""
    base = tmp_path_factory.mktemp("smbtorture")

    def run_one(suite: str) -> SuiteRun:
        workdir = base / suite
        workdir.mkdir()
        factory = ServerFactory(request, workdir)
        # smb2.acls.ACCESSBASED lists a second share, "hideunread", with
        # access-based enumeration (Samba's `hide unreadable`).
        shares = [(SHARE, False), (ABE_SHARE, False)]
        security, paths, options = None, None, []
        if factory.target == "nimbus":
            # vfs.fruit checks that the AAPL reply is 56 bytes long, the
            # length Samba's default model string ("MacSamba", 8
            # characters) gives: that model here; Nimbus's own default is
            # Apple's "Xserve". Its "invalid AFP_AfpInfo" test writes
            # through a second share of the same directory without Apple's
            # extensions (torture:share2).
            security = Security(abe_shares={ABE_SHARE}, apple_model=APPLE_MODEL, no_apple_shares={NO_APPLE_SHARE}, extra_users=[USER2], hide_files={SHARE: HIDE_FILES})
            shares.append((NO_APPLE_SHARE, False))
            data_dir = workdir / "data"
            data_dir.mkdir()
            paths = {SHARE: data_dir, NO_APPLE_SHARE: data_dir}
            options = [
                f"--option=torture:share2={NO_APPLE_SHARE}",
                f"--option=torture:user2name={USER2[0]}",
                f"--option=torture:user2password={USER2[1]}",
                ACL_XATTR_OPTION,
            ]
        srv = factory.start(shares, security=security, paths=paths)
        try:
            run = run_smbtorture(srv, suite, samba_client_conf, workdir / f"{suite}.subunit", SUITE_TIMEOUTS.get(suite, SUITE_TIMEOUT), options)
        finally:
            died = factory.stop_all()
        run.server, run.server_problems = srv, died
        return run

    lanes = SuiteLanes(run_one)
    lanes.start(selected_suites(request))
    yield lanes
    lanes.close()


def report(request, suite: str, run: SuiteRun, listed: list[str], where: str = "") -> None:
    """Print a suite's outcomes; a failing test's report gets its server's log tail."""
    if run.server is not None:
        request.node.stash.setdefault(_SERVERS, []).append(run.server)
    counts = {k: sum(1 for v in run.outcomes.values() if v == k) for k in (PASS, FAIL, SKIP)}
    print(f"{suite}{where}: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped of {len(listed)} listed; output in {run.log_path}")
    for name, outcome in sorted(run.outcomes.items()):
        print(f"  {outcome:4}  {name}" + (f"  ({first_line(run.details[name])})" if outcome != PASS else ""))
    for name in run.crashed_in:
        print(f"  smbtorture died during {name}; it was started again on the tests after it")


@require_tool("smbtorture", "samba-testsuite")  # skipped when missing; fails under CI=true
@pytest.mark.parametrize("suite", SUITES)
def test_smbtorture_suite(request, suite_runs, suite):
    known, _ = load_known_failures()
    skips, _ = load_expected_skips()
    listed = list_tests(suite)
    run = suite_runs.result(suite)
    report(request, suite, run, listed)
    problems = run.server_problems + judge(suite, listed, run, known, skips)
    assert not problems, f"smbtorture {suite}:\n" + "\n".join(problems)
