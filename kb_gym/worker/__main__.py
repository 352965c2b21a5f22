"""Worker process: ``python -m kb_gym.worker --device cuda:0``.

Speaks the protocol on its original stdin/stdout, which it moves to private descriptors at start;
fd 1 and 2 then both go to the stderr pipe, so whatever a candidate prints lands in a bounded log
the evaluator drains, never in the protocol stream.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path


def _take_protocol_fds() -> tuple[int, int]:
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    for fd in (proto_in, proto_out):
        os.set_inheritable(fd, False)  # children of a candidate must not hold the protocol pipe
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    return proto_in, proto_out


def _limits() -> None:
    # No core files; cap any single file a candidate writes. Address-space limits break CUDA's
    # virtual reservations, so memory is policed from the evaluator by resident size instead.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 30, 2 << 30))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-large writes fail with EFBIG instead


def _confine_writes(scratch: Path, cpu: bool) -> dict:
    """Landlock the worker to writing in its scratch folder, the extension build cache, /dev and its own
    /proc entry.

    KB_GYM_LANDLOCK: "1" on, "0" off, "auto" (default) on, and for a GPU worker whose CUDA does not
    start under the ruleset, the worker says so and the evaluator starts it again unconfined (main()).
    On the H200 image (driver 580, Landlock ABI 7) CUDA starts under it once /proc/<pid> is writable;
    scripts/gpu_landlock_probe.py shows which rule a driver trips over.
    """
    mode = os.environ.get("KB_GYM_LANDLOCK", "auto").lower()
    if mode in ("0", "off"):
        return {"landlock": 0}
    from kb_gym.worker.landlock import restrict_writes

    caches = {"TMPDIR": scratch / "tmp", "TRITON_CACHE_DIR": scratch / "triton",
              "TORCHINDUCTOR_CACHE_DIR": scratch / "inductor", "CUDA_CACHE_PATH": scratch / "nv"}
    for name, path in caches.items():
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    tempfile.tempdir = str(caches["TMPDIR"])
    extensions = os.environ.get("KB_GYM_EXTENSIONS_DIR")
    # /proc/<own pid>: glibc names another thread by writing /proc/self/task/TID/comm (drivers name
    # their threads); the entry covers only this process, not the evaluator or other workers.
    writable = [str(scratch), "/dev", f"/proc/{os.getpid()}"]
    if extensions:
        Path(extensions).mkdir(parents=True, exist_ok=True)
        writable.append(extensions)
    return restrict_writes(writable)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kb_gym.worker")
    parser.add_argument("--device", required=True)
    args = parser.parse_args()
    proto_in, proto_out = _take_protocol_fds()
    _limits()

    from kb_gym.worker.protocol import LANDLOCK_BREAKS_CUDA, MessageReader, ProtocolError, write_message

    # Every message of a job carries the job's secret token: a line the candidate writes to the
    # channel itself has none, and the evaluator rejects it instead of taking it for the verdict.
    current_token: list[str | None] = [None]

    def send(message: dict) -> None:
        if current_token[0] is not None:
            message = {**message, "token": current_token[0]}
        write_message(proto_out, message)

    started = time.perf_counter()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    scratch = Path(tempfile.mkdtemp(prefix="kb_gym_worker_"))
    sandbox = _confine_writes(scratch, cpu=args.device == "cpu")
    import torch  # noqa: F401 - import cost belongs to start-up, not the first evaluation

    from kb_gym.config import EvalConfig
    from kb_gym.hardware import fingerprint
    from kb_gym.worker.runtime import WorkerContext, run_job, warm_up

    if args.device.startswith("cuda"):
        try:
            torch.cuda.set_device(torch.device(args.device))
        except RuntimeError as exc:
            if not sandbox.get("landlock") or os.environ.get("KB_GYM_LANDLOCK", "auto").lower() != "auto":
                raise
            # Landlock cannot be lifted in this process: the evaluator starts an unconfined one instead.
            send({"type": LANDLOCK_BREAKS_CUDA, "error": str(exc)[:500]})
            os._exit(3)
    reader = MessageReader(proto_in)
    ctx = WorkerContext(args.device, scratch, send, receive=lambda: reader.read(None))
    warm_up(ctx, EvalConfig().to_dict())
    send({"type": "ready", "pid": os.getpid(), "scratch": str(scratch), "sandbox": sandbox,
          "startup_seconds": time.perf_counter() - started, "hardware": fingerprint(args.device)})
    while True:
        try:
            job = reader.read(None)
        except ProtocolError:
            break
        if job is None or job.get("type") == "shutdown":
            break
        current_token[0] = job.pop("token", None)
        result = run_job(ctx, job)
        result["type"] = "result"
        result["job_id"] = job.get("job_id")
        send(result)
        current_token[0] = None
        if result.get("restart"):
            break  # the evaluator starts a fresh worker
    os._exit(0)


if __name__ == "__main__":
    main()
