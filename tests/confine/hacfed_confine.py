"""Test confinement: record every file a test process opens, lists or creates outside the clone.

A clone must stand on its own (no sibling directory, no files of this machine's home). `tests/conftest.py`
installs this in the pytest process and, through `sitecustomize.py` in this folder (put first on
PYTHONPATH), in every Python process the tests start, so hacfed-server, hacfed-client and the Flower
processes they spawn are watched too. The hook is `sys.addaudithook` on the events `open`,
`os.listdir`, `os.scandir` and `os.mkdir`; it costs one dictionary lookup for every other event.

Where a path may be:
- inside the clone: allowed;
- inside a directory that existed beside the clone when the session started (a sibling folder):
  a violation, even when the clone's parent is itself a temporary or allowed directory, unless
  that directory is one of the specific roots below (a virtual environment kept in `../venv`);
- inside the specific roots of this run (the virtual environment, the Python installation,
  $HACFED_HOME, pytest's temporary directory): allowed;
- inside the general roots (the temporary directory, /proc, /sys, /dev, /etc, /usr): allowed;
- inside the source directory of a distribution installed in editable mode (a lab's own task package,
  `pip install -e ~/my-task`, found through `importlib.metadata`: its `direct_url.json`): allowed to
  read, and to write only the import system's `__pycache__`. Installed packages belong to the
  environment, like the virtual environment, not to the clone; a test must not write into them;
- anywhere else (the home directory, /opt, ...): a violation.
A read of a path that does not exist is not recorded (it reads nothing: libraries probe for optional
configuration files); writes and directory creation are recorded wherever they aim.

Each process appends its violations, once per (event, path), to `<log dir>/<pid>.tsv` as
`test id <TAB> event <TAB> path`, the test id being pytest's PYTEST_CURRENT_TEST at the time (a child
inherits its parent's). Configuration travels in `<log dir>/config.json`; the log dir's path in
$HACFED_TEST_CONFINE_LOG.
"""

from __future__ import annotations

import json
import os
import sys
import threading

LOG_ENV = "HACFED_TEST_CONFINE_LOG"
CONFIG_FILE = "config.json"
GENERAL_ROOTS = ("/tmp", "/proc", "/sys", "/dev", "/etc", "/usr")
_EVENTS = {"open": 0, "os.listdir": 0, "os.scandir": 0, "os.mkdir": 0}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def make_config(repo: str, specific: list[str], general: list[str] | None = None,
                installed: list[str] | None = None) -> dict[str, object]:
    """The rules of one session: `repo` and `specific` roots allowed, the entries beside `repo` that
    exist now forbidden, `general` roots (default GENERAL_ROOTS plus the temporary directory) allowed,
    `installed` roots (editable sources, `installed_sources`) readable; one that holds the clone is
    left out (it would allow everything)."""
    import tempfile

    repo = os.path.realpath(repo)
    parent = os.path.dirname(repo)
    siblings = []
    if parent != os.path.dirname(parent):  # beside a clone at the file system root is everything
        siblings = sorted(name for name in os.listdir(parent) if name != os.path.basename(repo))
    roots = list(GENERAL_ROOTS if general is None else general)
    if general is None:
        roots.append(tempfile.gettempdir())
    readable = [p for p in _both(installed or []) if not _under(repo, p)]
    return {"repo": repo, "specific": _both(specific), "general": _both(roots), "parent": parent, "siblings": siblings,
            "installed": readable}


def installed_sources(path: list[str] | None = None) -> list[str]:
    """The source directories of the distributions installed in editable mode that `path` (default
    sys.path) holds: the `file:` URL of each one's `direct_url.json` (PEP 610) whose `dir_info`
    says editable."""
    import importlib.metadata
    from urllib.parse import unquote, urlparse

    found = []
    for dist in importlib.metadata.distributions(**({} if path is None else {"path": path})):
        try:
            info = json.loads(dist.read_text("direct_url.json") or "{}")
        except ValueError:
            continue
        url = urlparse(str(info.get("url", ""))) if isinstance(info, dict) else None
        if url is not None and url.scheme == "file" and (info.get("dir_info") or {}).get("editable"):
            found.append(unquote(url.path))
    return sorted(set(found))


def _both(paths: list[str]) -> list[str]:
    """Each path as given (made absolute) and with its symbolic links resolved, without duplicates."""
    out: list[str] = []
    for p in paths:
        for form in (os.path.abspath(p), os.path.realpath(p)):
            if form not in out:
                out.append(form)
    return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


class Confinement:
    def __init__(self, config: dict[str, object], log_dir: str) -> None:
        self.repo = str(config["repo"])
        self.specific = [str(p) for p in config["specific"]]  # type: ignore[union-attr]
        self.general = [str(p) for p in config["general"]]  # type: ignore[union-attr]
        self.parent = str(config["parent"])
        self.siblings = frozenset(str(s) for s in config["siblings"])  # type: ignore[union-attr]
        self.installed = [str(p) for p in config.get("installed", [])]  # type: ignore[union-attr]
        self.log_path = os.path.join(log_dir, f"{os.getpid()}.tsv")
        self._seen: set[tuple[str, str]] = set()
        self._local = threading.local()

    def allowed(self, path: str) -> bool:
        if _under(path, self.repo):
            return True
        if self.siblings and _under(path, self.parent) and path != self.parent:
            name = path[len(self.parent):].lstrip(os.sep).split(os.sep, 1)[0]
            if name in self.siblings:  # only a specific root that is itself beside the clone (../venv) allows it
                return any(_under(path, r) and r != self.parent and _under(r, self.parent) for r in self.specific)
        return any(_under(path, r) for r in self.specific) or any(_under(path, r) for r in self.general)

    def readable(self, path: str, writing: bool) -> bool:
        """Inside an installed distribution's source: a read, or the import system's bytecode cache."""
        if writing and "__pycache__" not in path.split(os.sep):
            return False
        return any(_under(path, r) for r in self.installed)

    def hook(self, event: str, args: tuple[object, ...]) -> None:
        if event not in _EVENTS or getattr(self._local, "busy", False):
            return
        self._local.busy = True
        try:
            self._check(event, args)
        except Exception:  # noqa: BLE001 - a watcher must never break the code it watches
            pass
        finally:
            self._local.busy = False

    def _check(self, event: str, args: tuple[object, ...]) -> None:
        target = args[0] if args else None
        if target is None or isinstance(target, int):  # a file descriptor: its path was checked when opened
            return
        path = os.path.abspath(os.fsdecode(target))  # type: ignore[arg-type]
        if self.allowed(path) or self.allowed(os.path.realpath(path)):
            return
        writing = event == "os.mkdir"
        if event == "open":
            mode, flags = (args + (None, None))[1:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and bool(flags & _WRITE_FLAGS))
        if not writing and not os.path.lexists(path):
            return
        if self.readable(path, writing) or self.readable(os.path.realpath(path), writing):
            return
        key = (event, path)
        if key in self._seen:
            return
        self._seen.add(key)
        test = os.environ.get("PYTEST_CURRENT_TEST", "(outside any test)")
        line = "\t".join(s.replace("\t", " ").replace("\n", " ") for s in (test, event, path)) + "\n"
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode("utf-8", errors="replace"))
        finally:
            os.close(fd)


def install(log_dir: str) -> Confinement:
    """Watch this process with the rules in `<log_dir>/config.json` (an audit hook stays for life)."""
    with open(os.path.join(log_dir, CONFIG_FILE), encoding="utf-8") as fh:
        confinement = Confinement(json.load(fh), log_dir)
    sys.addaudithook(confinement.hook)
    return confinement


def read_violations(log_dir: str) -> list[tuple[str, str, str]]:
    """Every (test id, event, path) recorded so far by any watched process, in a stable order."""
    found: set[tuple[str, str, str]] = set()
    for name in os.listdir(log_dir):
        if name.endswith(".tsv"):
            with open(os.path.join(log_dir, name), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) == 3:
                        found.add((parts[0], parts[1], parts[2]))
    return sorted(found)


# ----------------------------------------------------------------------------- the pytest plugin
# tests/conftest.py imports these hooks; `pytest -p hacfed_confine` (this folder on PYTHONPATH) loads
# them into any other session. pytest itself is imported only inside them: watched children never
# import it.

ENABLE_ENV = "HACFED_TEST_CONFINE"  # "0" switches the check off (CI sets "1")
_session: dict[str, object] = {}


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest.Config
    import getpass
    import tempfile

    if os.environ.get(ENABLE_ENV, "1") == "0" or hasattr(config, "workerinput"):
        return
    specific = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.join(tempfile.gettempdir(), f"pytest-of-{getpass.getuser()}")]
    if config.option.basetemp:
        specific.append(str(config.option.basetemp))
    if os.environ.get("HACFED_HOME"):
        specific.append(os.environ["HACFED_HOME"])
    log_dir = tempfile.mkdtemp(prefix="hacfed-confine-")
    with open(os.path.join(log_dir, CONFIG_FILE), "w", encoding="utf-8") as fh:
        json.dump(make_config(str(config.rootpath), specific, installed=installed_sources()), fh)
    here = os.path.dirname(os.path.abspath(__file__))
    _session.update(log_dir=log_dir, reported=set(), env={k: os.environ.get(k) for k in (LOG_ENV, "PYTHONPATH")})
    os.environ[LOG_ENV] = log_dir
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    install(log_dir)


def _describe(found: list[tuple[str, str, str]]) -> str:
    return "\n".join(f"  {event} {path}   [{test}]" for test, event, path in found)


def runtest_teardown(item) -> None:  # noqa: ANN001 - pytest.Item
    """Fail the test (an error at teardown) that read or wrote outside the clone, naming the paths."""
    if "log_dir" not in _session:
        return
    mine = [v for v in read_violations(str(_session["log_dir"])) if v[0].startswith(item.nodeid + " (")]
    reported: set = _session["reported"]  # type: ignore[assignment]
    new = [v for v in mine if v not in reported]
    reported.update(new)
    if new:
        import pytest

        pytest.fail("this test (or a process it started) used files outside the clone; a fresh clone has nothing "
                    "there:\n" + _describe(new), pytrace=False)


if "pytest" in sys.modules:  # in a pytest process: after the test's own teardown (its fixtures, its children)
    import pytest

    pytest_runtest_teardown = pytest.hookimpl(trylast=True)(runtest_teardown)


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001 - pytest.Session
    if "log_dir" not in _session:
        return
    found = read_violations(str(_session["log_dir"]))
    _session["found"] = found
    if found and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    found = _session.get("found")
    if found:
        terminalreporter.section("files outside the clone", sep="=", red=True, bold=True)
        terminalreporter.line(f"FAILED: the tests used {len(found)} path(s) outside the clone (event, path, "
                              f"[test]); set {ENABLE_ENV}=0 to run without this check:")
        terminalreporter.line(_describe(found))  # type: ignore[arg-type]


def pytest_unconfigure(config) -> None:  # noqa: ANN001
    import shutil

    if "log_dir" not in _session:
        return
    for key, value in _session["env"].items():  # type: ignore[union-attr]
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(str(_session["log_dir"]), ignore_errors=True)
    _session.clear()
