"""Judge process: ``python -m kb_gym.worker --device cuda:0``.

The evaluator's worker for one device: it decides verdicts and never runs candidate code (job.py);
each candidate runs in a one-use runner it starts (runner.py). Speaks the protocol on its original
stdin/stdout, which it moves to private descriptors at start; fd 1 and 2 then both go to the stderr
pipe, so whatever is printed lands in a bounded log the evaluator drains, never in the protocol.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from kb_gym.worker.process import exit_when_orphaned, set_limits, take_protocol_fds


def _scratch_caches(scratch: Path) -> dict:
    """The judge runs no candidate code, so it is not confined itself (its runners are: runner.py); its
    own caches (Triton, Inductor for a compiled baseline) live in its scratch folder."""
    caches = {"TMPDIR": scratch / "tmp", "TRITON_CACHE_DIR": scratch / "triton",
              "TORCHINDUCTOR_CACHE_DIR": scratch / "inductor", "CUDA_CACHE_PATH": scratch / "nv"}
    for name, path in caches.items():
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    tempfile.tempdir = str(caches["TMPDIR"])
    return {"landlock": 0, "judge": "runs no candidate code; candidates run in one-use runners"}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kb_gym.worker")
    parser.add_argument("--device", required=True)
    args = parser.parse_args()
    proto_in, proto_out = take_protocol_fds()
    set_limits()
    exit_when_orphaned(proto_in)

    from kb_gym.worker.protocol import MessageReader, ProtocolError, write_message

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
    sandbox = _scratch_caches(scratch)
    import torch  # noqa: F401 - import cost belongs to start-up, not the first evaluation

    from kb_gym.config import EvalConfig
    from kb_gym.hardware import fingerprint
    from kb_gym.worker.job import WorkerContext, run_job, warm_up

    if args.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(args.device))
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
    if ctx.pool is not None:
        ctx.pool.close()
    if ctx.probe is not None:
        ctx.probe.close()
    os._exit(0)


if __name__ == "__main__":
    main()
