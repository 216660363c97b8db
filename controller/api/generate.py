"""Regenerate the committed Python stubs from `controller/api/stoke.proto`.

    python -m controller.api.generate            # rewrite the stubs (only files whose bytes change)
    python -m controller.api.generate --check    # exit 1 if the committed stubs are stale

The stubs are generated with grpcio-tools with the repository root as the
proto path, so the generated code imports `controller.api.stoke_pb2`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

API_DIR = Path(__file__).resolve().parent
ROOT = API_DIR.parent.parent
PROTO = "controller/api/stoke.proto"
OUTPUTS = ("stoke_pb2.py", "stoke_pb2_grpc.py", "stoke_pb2.pyi")


def generate_into(out_dir: Path) -> dict[str, str]:
    """Run protoc into `out_dir`; return {file name: text} of the stubs."""
    from importlib import resources

    from grpc_tools import protoc  # build-time tool, imported only here

    include = str(resources.files("grpc_tools") / "_proto")
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(ROOT / PROTO),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit {code})")
    return {name: (out_dir / "controller" / "api" / name).read_text() for name in OUTPUTS}


def fresh_stubs() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        return generate_into(Path(tmp))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that the committed stubs are fresh")
    args = parser.parse_args(argv)
    stale = []
    for name, text in fresh_stubs().items():
        target = API_DIR / name
        current = target.read_text() if target.exists() else None
        if current != text:
            stale.append(name)
            if not args.check:
                tmp = target.with_suffix(target.suffix + ".tmp")
                tmp.write_text(text)
                tmp.replace(target)
    if args.check and stale:
        print(f"stale stubs: {', '.join(stale)}; run `python -m controller.api.generate`", file=sys.stderr)
        return 1
    print("stubs " + ("rewritten: " + ", ".join(stale) if stale else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
