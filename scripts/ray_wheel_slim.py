"""Ray's wheel without the parts the evaluation service never loads, so that it fits one device call.

    python3 scripts/ray_wheel_slim.py RAY_WHEEL OUT_DIR

Ray 2.60's wheel is 79 MB; a device call carries 64 MB with the working tree. The service
(kb_gym/service) uses Ray core only: actors, the object store, the GCS and the raylet. Dropped: the Java
workers' jar, the dashboard's web UI build (we start Ray with include_dashboard=False), and the
libraries built on core that kb_gym never imports (RLlib, Tune, Train, Serve, Data, LLM). What remains is
~39 MB. The wheel's RECORD is rewritten for what it now holds, so pip installs it as any other wheel.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

DROPPED = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/tune/", "ray/train/",
           "ray/serve/", "ray/data/", "ray/llm/")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info.filename.startswith(DROPPED) or info.filename == record_name:
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            lines.append(_record_line(info.filename, data))
        lines.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(lines) + "\n")
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    out = slim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{out}: {out.stat().st_size / 1e6:.1f} MB (was {Path(sys.argv[1]).stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
