"""Stand-ins shared by the adversarial rounds and tests/test_triton_launchers.py: a process tree the neighbour pause
can stop (``Tree``), and a Triton driver that builds launchers as Triton 3.6 does (``fake_driver``)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types
from pathlib import Path

from kb_gym import sandbox
from kb_gym.worker import neighbours
from kb_gym.worker.runner_client import RunnerProcess


class Tree:
    """What PauseWatcher needs of a runner (as in tests/test_neighbours.py): a pid and counted stops."""

    stop = RunnerProcess.stop
    restop = RunnerProcess.restop
    resume = RunnerProcess.resume

    def __init__(self, code: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True)
        self.pid = self.proc.pid
        self._stops, self._stopped, self._stop_lock = 0, set(), threading.Lock()

    def close(self) -> None:
        sandbox.kill_tree(self.pid)
        self.proc.kill()
        self.proc.wait()


def tree_cpu_ns(pid: int) -> int:
    return sum(u.cpu_ns for u in sandbox.process_usage(pid).values())


def through_a_measurement(code: str, folder: Path, loading_s: float, wait: float | None = None) -> tuple[str, float]:
    """A tree running ``code`` loads for ``loading_s``, then is paused for a 2 s measurement (``Measuring.begin``
    waiting ``wait``, its default where None): the watcher's verdict ("" where none) and the CPU seconds the tree
    ran inside the measurement."""
    files = folder / "cpu.measure", folder / "cpu.unpaused"
    tree = Tree(code)
    watcher = neighbours.PauseWatcher(files, tree)
    try:
        time.sleep(loading_s)
        watcher.watch()
        measuring = neighbours.Measuring(files)
        assert measuring.begin() if wait is None else measuring.begin(wait=wait)
        before = tree_cpu_ns(tree.pid)
        time.sleep(2.0)  # another candidate's measurement
        ran_s = (tree_cpu_ns(tree.pid) - before) / 1e9
        measuring.end()
        time.sleep(0.1)
        return watcher.verdict, ran_s
    finally:
        watcher.unwatch()
        tree.close()


def _kind(t: str) -> str:
    return "ptr" if t.startswith("*") else t


def fake_driver(name: str = "fake_nvidia_driver") -> types.ModuleType:
    """Triton 3.6's NVIDIA driver as triton_launchers uses it: ``make_launcher`` writes a real C extension named as
    Triton's launcher is, whose source depends on the argument kinds only (as 3.6's does), for Triton's own
    ``compile_module_from_src`` to build and cache."""
    driver = types.ModuleType(name)

    def make_launcher(constants, signature, tensordesc_meta):  # noqa: ANN001, ANN202
        kinds = ",".join(_kind(t) for t in signature.values())
        return ("#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n"
                f"static const char kinds[] = \"{kinds}\";\n"
                "static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"__triton_launcher\", NULL, 0, NULL};\n"
                "PyMODINIT_FUNC PyInit___triton_launcher(void) {\n"
                "  PyObject *mod = PyModule_Create(&m);\n"
                "  if (mod) PyModule_AddStringConstant(mod, \"kinds\", kinds);\n  return mod;\n}\n")

    driver.make_launcher = make_launcher
    driver.library_dirs = lambda: []
    driver.include_dirs = []
    driver.libraries = []
    return driver
