# A pytest plugin of the fleet's offline base images: serves `--ctrf FILE` (pytest-json-ctrf's option,
# which Terminal-Bench 2 tests pass) with a minimal CTRF report, so the stand-in uvx can run them.
import json
import time

_tests = []
_start = int(time.time() * 1000)


def pytest_addoption(parser):
    try:
        parser.addoption("--ctrf", action="store", default=None, help="write a CTRF JSON report (stand-in)")
    except ValueError:
        pass  # the real pytest-json-ctrf is installed and owns the option


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _tests.append({"name": report.nodeid, "status": report.outcome, "duration": int(report.duration * 1000)})


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--ctrf", default=None)
    if not path:
        return
    counts = {k: sum(1 for t in _tests if t["status"] == k) for k in ("passed", "failed", "skipped")}
    summary = {"tests": len(_tests), **counts, "pending": 0, "other": 0, "start": _start, "stop": int(time.time() * 1000)}
    with open(path, "w") as f:
        json.dump({"results": {"tool": {"name": "pytest"}, "summary": summary, "tests": _tests}}, f)
