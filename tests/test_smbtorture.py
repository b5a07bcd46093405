"""Samba's smbtorture (Debian's samba-testsuite) SMB2 suites against nimbus.

Each suite runs against a fresh server. Its results are compared with
tests/smbtorture/known-failures.txt, so that the list can only shrink:

- a test that fails and is not listed is a regression: this test fails;
- a listed test that now passes must be taken off the list: this test fails
  and says "remove NAME from known-failures";
- a listed test that no longer runs (renamed, or skipped) must come off too.

known-failures.txt holds one full test name per line followed by `# reason`;
a line starting with # is a comment. Every entry must give its reason.

NIMBUS_TORTURE_TIMEOUT (seconds, default 180; smbd needs at most 11) bounds each
suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SUITES = [
    "smb2.connect",
    "smb2.read",
    "smb2.rw",
    "smb2.dir",
    "smb2.getinfo",
    "smb2.setinfo",
    "smb2.compound",
    "smb2.credits",
    "smb2.create",
]
KNOWN_FAILURES = Path(__file__).resolve().parent / "smbtorture" / "known-failures.txt"
SUITE_TIMEOUT = int(os.environ.get("NIMBUS_TORTURE_TIMEOUT", "180"))

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
_LINE = re.compile(r"^(?P<word>[a-z]+): (?P<name>\S+)(?P<bracket> \[)?\s*$")


@dataclass
class SuiteRun:
    outcomes: dict[str, str] = field(default_factory=dict)  # test -> PASS / FAIL / SKIP
    details: dict[str, str] = field(default_factory=dict)  # test -> reason smbtorture gave
    timed_out: bool = False
    returncode: int | None = None
    output: str = ""


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
    return run


def load_known_failures(path: Path = KNOWN_FAILURES) -> tuple[dict[str, str], list[str]]:
    """Return ({test name: reason}, [problems with the file])."""
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
            problems.append(f"{where}: `{name}` gives no reason; write `{name}  # why it fails`")
        if not name or any(c.isspace() for c in name):
            problems.append(f"{where}: `{name}` is not one test name")
            continue
        if name in entries:
            problems.append(f"{where}: `{name}` is listed twice")
        if not any(name == s or name.startswith(s + ".") for s in SUITES):
            problems.append(f"{where}: `{name}` is in none of the suites run here ({', '.join(SUITES)})")
        entries[name] = reason
    return entries, problems


def run_smbtorture(server, suite: str, client_conf: Path, log_path: Path, timeout: int = SUITE_TIMEOUT) -> SuiteRun:
    cmd = [
        "smbtorture",
        f"//{server.host}/{server.share}",
        "-p", str(server.port),
        "-U", f"{server.user}%{server.password}",
        "--use-kerberos=off",
        "-s", str(client_conf),
        "--format=subunit",
        "--fullname",
        f"--maximum-runtime={timeout}",
        suite,
    ]  # fmt: skip
    timed_out = False
    try:
        # smbtorture leaves a smbtortureXXXXXX directory in its working directory
        proc = subprocess.run(cmd, cwd=log_path.parent, capture_output=True, timeout=timeout + 30, stdin=subprocess.DEVNULL)
        out, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, returncode, timed_out = (e.stdout or b"") + (e.stderr or b""), None, True
    text = out.decode("utf-8", errors="replace")
    log_path.write_text(text)
    run = parse_subunit(text)
    run.returncode = returncode
    run.timed_out = timed_out or "maximum runtime" in text.lower()
    return run


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


# --------------------------------------------------------------------------


def test_known_failures_file_is_well_formed():
    _, problems = load_known_failures()
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(shutil.which("smbtorture") is None, reason="smbtorture not installed (apt-get install samba-testsuite)")
@pytest.mark.parametrize("suite", SUITES)
def test_smbtorture_suite(server, suite, samba_client_conf, tmp_path):
    known, _ = load_known_failures()
    known_here = {n: r for n, r in known.items() if n == suite or n.startswith(suite + ".")}
    log_path = tmp_path / f"{suite}.subunit"
    run = run_smbtorture(server, suite, samba_client_conf, log_path)

    counts = {k: sum(1 for v in run.outcomes.values() if v == k) for k in (PASS, FAIL, SKIP)}
    print(f"{suite}: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped; output in {log_path}")
    for name, outcome in sorted(run.outcomes.items()):
        print(f"  {outcome:4}  {name}" + (f"  ({first_line(run.details[name])})" if outcome != PASS else ""))

    problems = []
    if not run.outcomes:
        tail = "\n".join(run.output.splitlines()[-30:])
        problems.append(f"smbtorture reported no result (exit status {run.returncode}):\n{tail}")
    if run.timed_out:
        problems.append(f"{suite} did not finish within {SUITE_TIMEOUT} s; the tests after the last result did not run")

    regressions = sorted(n for n, o in run.outcomes.items() if o == FAIL and n not in known)
    if regressions:
        problems.append(
            "failed and not in tests/smbtorture/known-failures.txt (regression):\n"
            + "\n".join(f"  {n}: {first_line(run.details.get(n, ''))}" for n in regressions)
        )
    fixed = sorted(n for n in known_here if run.outcomes.get(n) == PASS)
    if fixed:
        problems.append("listed as known failures but now pass:\n" + "\n".join(f"  remove {n} from known-failures" for n in fixed))
    if not run.timed_out and run.outcomes:
        stale = sorted(n for n in known_here if run.outcomes.get(n) in (None, SKIP))
        if stale:
            problems.append(
                "listed as known failures but did not run or were skipped:\n"
                + "\n".join(f"  remove {n} from known-failures" for n in stale)
            )
    assert not problems, f"smbtorture {suite}:\n" + "\n".join(problems)
