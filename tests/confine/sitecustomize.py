"""Loaded at start-up by every Python process the tests start (this folder is first on PYTHONPATH):
watch it with the session's confinement rules (hacfed_confine.py), then hand over to any
sitecustomize this one shadows."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("HACFED_TEST_CONFINE_LOG"):
    import importlib.util

    # Under a private name: a pytest started by a test may load hacfed_confine as its own plugin.
    _spec = importlib.util.spec_from_file_location("_hacfed_confine_watch", os.path.join(_here, "hacfed_confine.py"))
    _watch = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_watch)
    try:
        _watch.install(os.environ["HACFED_TEST_CONFINE_LOG"])
    except OSError:  # the session ended and removed its log dir: nothing left to report to
        pass

_me, _saved = sys.modules[__name__], sys.path[:]
try:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    del sys.modules["sitecustomize"]
    import sitecustomize  # noqa: F401 - the next one on the path, if any
except ImportError:
    pass
finally:
    sys.path[:] = _saved
    sys.modules.setdefault("sitecustomize", _me)  # the import system expects an entry under this name
